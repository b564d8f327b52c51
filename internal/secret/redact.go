package secret

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
)

// urlInText is an http(s) URL inside free text such as an error message:
// it ends at white space, a quote, an angle bracket or a backslash, none of
// which a valid query string holds unescaped.
var urlInText = regexp.MustCompile("(?i)https?://[^\\s\"<>\\\\`]+")

// RedactText returns s with the query values and the password of every
// http(s) URL in it replaced by Redacted. Go's HTTP client puts the request
// URL, query and all, into its errors; this keeps such errors fit to show
// and log.
func RedactText(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return urlInText.ReplaceAllStringFunc(s, func(u string) string {
		redacted, _ := SplitURL(redactPassword(u))
		return redacted
	})
}

// redactPassword replaces the password of rawURL's user information, if it
// has one, by Redacted: https://user:REDACTED@host/.
func redactPassword(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return rawURL
	}
	user, _, hasPassword := strings.Cut(authority[:at], ":")
	if !hasPassword {
		return rawURL
	}
	return scheme + "://" + user + ":" + Redacted + rest[at:]
}

// NewRedactingHandler returns a slog.Handler that passes records on to next
// with RedactText applied to the message and to every string and error
// attribute, in groups too. Errors of MCP connections carry their URLs, so
// the service's logger goes through it.
func NewRedactingHandler(next slog.Handler) slog.Handler { return redactingHandler{next: next} }

type redactingHandler struct {
	next slog.Handler
}

func (h redactingHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	if !mayRedact(r) {
		return h.next.Handle(ctx, r) // most records: no copy
	}
	out := slog.NewRecord(r.Time, r.Level, RedactText(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// mayRedact reports whether redacting r may change it: its message or a
// string attribute holds "://", or an attribute is an error, a group or a
// LogValuer (looked at only when redacting).
func mayRedact(r slog.Record) bool {
	if strings.Contains(r.Message, "://") {
		return true
	}
	found := false
	r.Attrs(func(a slog.Attr) bool {
		switch a.Value.Kind() {
		case slog.KindString:
			found = strings.Contains(a.Value.String(), "://")
		case slog.KindGroup, slog.KindLogValuer:
			found = true
		case slog.KindAny:
			_, found = a.Value.Any().(error)
		}
		return !found
	})
	return found
}

func (h redactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return redactingHandler{next: h.next.WithAttrs(redactAttrs(attrs))}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{next: h.next.WithGroup(name)}
}

func redactAttrs(attrs []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = redactAttr(a)
	}
	return out
}

func redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		v = slog.StringValue(RedactText(v.String()))
	case slog.KindGroup:
		v = slog.GroupValue(redactAttrs(v.Group())...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			v = slog.StringValue(RedactText(err.Error()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
