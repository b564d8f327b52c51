package oauth

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/connector-svc/connector-svc/internal/secret"
)

// maxReturnTo bounds a return_to's length in bytes.
const maxReturnTo = 2048

// returnPrefix is one entry of OAUTH_RETURN_TO_ALLOWED, parsed: a
// return_to is under it when its scheme and host:port are the prefix's
// and its path is the prefix's or below it.
type returnPrefix struct {
	raw    string
	origin string // scheme://host:port, lowercased, the port explicit
	path   string // escaped
}

// parseReturnPrefix parses an allowed prefix: an absolute http(s) URL
// without user information, query or fragment.
func parseReturnPrefix(raw string) (returnPrefix, error) {
	bad := func(why string) (returnPrefix, error) {
		return returnPrefix{}, fmt.Errorf("OAUTH_RETURN_TO_ALLOWED has %q, %s", raw, why)
	}
	if raw == "" {
		return bad("an empty prefix, which would allow any return_to")
	}
	if i, why := badURLChar(raw); i >= 0 {
		return bad(fmt.Sprintf("which has %s at byte %d", why, i))
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return bad("which is not an absolute http(s) URL")
	}
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#") {
		return bad("which has user information, a query or a fragment: a prefix is a scheme, host, port and path")
	}
	return returnPrefix{raw: raw, origin: origin(u), path: u.EscapedPath()}, nil
}

// covers says whether u, an absolute http(s) URL, is under p: the same
// scheme, host (in any case) and port, and a path that is p's, or
// continues it after a "/" (p's own final one, or the next).
func (p returnPrefix) covers(u *url.URL) bool {
	if origin(u) != p.origin {
		return false
	}
	path := u.EscapedPath()
	switch {
	case p.path == "" || p.path == "/" || path == p.path:
		return true
	case strings.HasSuffix(p.path, "/"):
		return strings.HasPrefix(path, p.path)
	default:
		return strings.HasPrefix(path, p.path+"/")
	}
}

// checkReturnTo says whether raw may be where the callback sends the
// browser: empty, or an absolute http(s) URL of at most maxReturnTo bytes,
// of characters a URL may hold, without user information or dot segments
// in its path, under one of allowed. A refusal is a *returnToError naming
// what is wrong with the value (the caller names the field); it never
// quotes the control characters it found.
func checkReturnTo(raw string, allowed []returnPrefix) error {
	if raw == "" {
		return nil
	}
	refuse := func(format string, args ...any) error {
		return &returnToError{why: fmt.Sprintf(format, args...)}
	}
	if len(allowed) == 0 {
		return refuse("no return_to is allowed: OAUTH_RETURN_TO_ALLOWED is empty")
	}
	if len(raw) > maxReturnTo {
		return refuse("longer than %d bytes", maxReturnTo)
	}
	if i, why := badURLChar(raw); i >= 0 {
		return refuse("has %s at byte %d, which a URL may not hold unencoded", why, i)
	}
	shown := secret.RedactText(raw) // its query values may be anything
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return refuse("%q is not an absolute http(s) URL", shown)
	}
	if u.User != nil {
		return refuse("%q has user information before its host (user@host), which is not allowed", shown)
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == "." || seg == ".." {
			return refuse("%q has a dot segment (. or ..) in its path, which is not allowed", shown)
		}
	}
	for _, p := range allowed {
		if p.covers(u) {
			return nil
		}
	}
	prefixes := make([]string, len(allowed))
	for i, p := range allowed {
		prefixes[i] = p.raw
	}
	return refuse("%s://%s%s is not under any allowed prefix (OAUTH_RETURN_TO_ALLOWED: %s)",
		u.Scheme, u.Host, u.EscapedPath(), strings.Join(prefixes, ", "))
}

// badURLChar finds the first byte of s that RFC 3986 does not allow in a
// URL (unreserved, reserved and "%" are): its index and what it is, or -1.
func badURLChar(s string) (int, string) {
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		case strings.IndexByte("-._~:/?#[]@!$&'()*+,;=%", b) >= 0:
		case b < 0x20 || b == 0x7f:
			return i, "a control character"
		case b == ' ':
			return i, "a space character"
		case b >= 0x80:
			return i, "a non-ASCII character (percent-encode it)"
		default:
			return i, fmt.Sprintf("the character %q", rune(b))
		}
	}
	return -1, ""
}
