package oauth

import (
	"net/http"
	"strings"
)

// challenge is one authentication challenge of a WWW-Authenticate header
// (RFC 9110 §11.6.1): a scheme and its parameters, names lowercased.
type challenge struct {
	scheme string
	params map[string]string
}

// bearer is what a server's Bearer challenge says (RFC 6750 §3, RFC 9728
// §5.1).
type bearer struct {
	found            bool
	resourceMetadata string
	scope            []string
	err              string // error, such as invalid_token or insufficient_scope
}

// bearerChallenge reads the first Bearer challenge of h's WWW-Authenticate
// headers; found is false if there is none.
func bearerChallenge(h http.Header) bearer {
	for _, c := range parseChallenges(h.Values("WWW-Authenticate")) {
		if c.scheme != "bearer" {
			continue
		}
		return bearer{
			found:            true,
			resourceMetadata: c.params["resource_metadata"],
			scope:            strings.Fields(c.params["scope"]),
			err:              c.params["error"],
		}
	}
	return bearer{}
}

// parseChallenges parses WWW-Authenticate header values: each holds one
// or more challenges separated by commas, each a scheme followed by a
// token68 or by comma-separated auth-params whose values are tokens or
// quoted strings. It is lenient: what does not parse is skipped, and an
// unquoted value runs to the next comma or space (servers send unquoted
// URLs). The first value of a repeated parameter wins.
func parseChallenges(values []string) []challenge {
	var out []challenge
	for _, s := range values {
		p := &parser{s: s}
		for {
			p.skip(" \t,")
			if p.done() {
				break
			}
			scheme := p.token()
			if scheme == "" {
				p.i++ // not a token: skip the character
				continue
			}
			c := challenge{scheme: strings.ToLower(scheme), params: map[string]string{}}
			p.params(c.params)
			out = append(out, c)
		}
	}
	return out
}

type parser struct {
	s string
	i int
}

func (p *parser) done() bool { return p.i >= len(p.s) }

func (p *parser) skip(set string) {
	for p.i < len(p.s) && strings.IndexByte(set, p.s[p.i]) >= 0 {
		p.i++
	}
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func (p *parser) token() string {
	start := p.i
	for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

// params reads the auth-params of one challenge into into, and stops
// before the next challenge's scheme: a token not followed by "=". A
// token68 ("Basic dXNlcg==") is read as a scheme or a parameter of its
// own; it carries nothing this package reads.
func (p *parser) params(into map[string]string) {
	for {
		p.skip(" \t,")
		if p.done() {
			return
		}
		start := p.i
		name := p.token()
		if name == "" {
			p.i++ // not a token: skip the character
			continue
		}
		p.skip(" \t")
		if p.done() || p.s[p.i] != '=' {
			p.i = start // the next challenge
			return
		}
		p.i++ // '='
		p.skip(" \t")
		var value string
		if !p.done() && p.s[p.i] == '"' {
			value = p.quoted()
		} else {
			from := p.i
			for p.i < len(p.s) && p.s[p.i] != ',' && p.s[p.i] != ' ' && p.s[p.i] != '\t' {
				p.i++
			}
			value = p.s[from:p.i]
		}
		key := strings.ToLower(name)
		if _, seen := into[key]; !seen {
			into[key] = value
		}
	}
}

// quoted reads a quoted-string starting at the opening quote, undoing
// backslash escapes; an unterminated one runs to the end.
func (p *parser) quoted() string {
	p.i++ // opening quote
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\\' && p.i+1 < len(p.s):
			b.WriteByte(p.s[p.i+1])
			p.i += 2
		case c == '"':
			p.i++
			return b.String()
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	return b.String()
}
