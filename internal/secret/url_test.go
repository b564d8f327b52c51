package secret_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/secret"
)

func TestSplitAndJoinURL(t *testing.T) {
	tests := []struct {
		name, url, redacted, joined string
		query                       []secret.Param
	}{
		{name: "no query", url: "http://h/mcp", redacted: "http://h/mcp", joined: "http://h/mcp"},
		{name: "empty query", url: "http://h/mcp?", redacted: "http://h/mcp?", joined: "http://h/mcp?"},
		{
			name:     "order, repeated names, escapes, empty values and a fragment",
			url:      "https://h:8443/v1/mcp?api_key=" + distinctive + "&team=a%2Fb%26c&api_key=2&flag&empty=#top",
			redacted: "https://h:8443/v1/mcp?api_key=REDACTED&team=REDACTED&api_key=REDACTED&flag=&empty=#top",
			joined:   "https://h:8443/v1/mcp?api_key=" + distinctive + "&team=a%2Fb%26c&api_key=2&flag=&empty=#top",
			query: []secret.Param{{Name: "api_key", Value: distinctive}, {Name: "team", Value: "a%2Fb%26c"},
				{Name: "api_key", Value: "2"}, {Name: "flag"}, {Name: "empty"}},
		},
		{name: "'?' in a value", url: "http://h/?next=/a?b=c", redacted: "http://h/?next=REDACTED", joined: "http://h/?next=/a?b=c",
			query: []secret.Param{{Name: "next", Value: "/a?b=c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			redacted, query := secret.SplitURL(tt.url)
			if redacted != tt.redacted {
				t.Errorf("SplitURL redacted = %q, want %q", redacted, tt.redacted)
			}
			if diff := cmp.Diff(tt.query, query); diff != "" {
				t.Errorf("SplitURL query (-want +got):\n%s", diff)
			}
			if joined := secret.JoinURL(redacted, query); joined != tt.joined {
				t.Errorf("JoinURL = %q, want %q", joined, tt.joined)
			}
		})
	}
}

func TestRedactText(t *testing.T) {
	tests := []struct{ in, want string }{
		{`Post "http://127.0.0.1:9/mcp?api_key=` + distinctive + `&v=2": dial tcp 127.0.0.1:9: connection refused`,
			`Post "http://127.0.0.1:9/mcp?api_key=REDACTED&v=REDACTED": dial tcp 127.0.0.1:9: connection refused`},
		{"GET HTTPS://h/sse?k=" + distinctive + " failed; retry http://other/x?y=" + distinctive,
			"GET HTTPS://h/sse?k=REDACTED failed; retry http://other/x?y=REDACTED"},
		{"no URL here: k=v", "no URL here: k=v"},
		{"http://h/mcp without a query", "http://h/mcp without a query"},
		{"base_url=https://me:" + distinctive + "@llm.example:8443/v1?key=" + distinctive,
			"base_url=https://me:REDACTED@llm.example:8443/v1?key=REDACTED"},
		{"http://me:p@" + distinctive + "@h", "http://me:REDACTED@h"},
		{"http://only-user@h/x and http://h/a@b", "http://only-user@h/x and http://h/a@b"},
	}
	for _, tt := range tests {
		if got := secret.RedactText(tt.in); got != tt.want {
			t.Errorf("RedactText(%q)\n = %q\nwant %q", tt.in, got, tt.want)
		}
	}
}

func TestRedactingHandler(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(secret.NewRedactingHandler(slog.NewJSONHandler(&buf, nil)))
	u := "http://h/mcp?api_key=" + distinctive
	logger.With("url", u).WithGroup("g").Warn("connector down: "+u,
		"error", errors.New(`Post "`+u+`": refused`), slog.Group("inner", "url", u), "n", 3)
	out := buf.String()
	if strings.Contains(out, distinctive) {
		t.Errorf("log line holds the query value: %s", out)
	}
	if strings.Count(out, "api_key=REDACTED") != 4 || !strings.Contains(out, `"n":3`) {
		t.Errorf("log line lost its content: %s", out)
	}
}

// logValuer logs as the URL it holds.
type logValuer string

func (v logValuer) LogValue() slog.Value { return slog.StringValue(string(v)) }

// TestRedactingHandlerEachAttr puts a secret URL in one attribute of a
// record whose message has none, of each kind that can carry one; a record
// with none passes unchanged.
func TestRedactingHandlerEachAttr(t *testing.T) {
	u := "http://h/mcp?api_key=" + distinctive
	for _, tt := range []struct {
		name string
		attr slog.Attr
		want string
	}{
		{"string", slog.String("url", u), `"url":"http://h/mcp?api_key=REDACTED"`},
		{"error", slog.Any("error", errors.New(`Post "`+u+`": refused`)), `"error":"Post \"http://h/mcp?api_key=REDACTED\": refused"`},
		{"group", slog.Group("g", "url", u), `"g":{"url":"http://h/mcp?api_key=REDACTED"}`},
		{"log valuer", slog.Any("url", logValuer(u)), `"url":"http://h/mcp?api_key=REDACTED"`},
		{"none", slog.String("url", "http://h/mcp"), `"url":"http://h/mcp"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			slog.New(secret.NewRedactingHandler(slog.NewJSONHandler(&buf, nil))).LogAttrs(context.Background(),
				slog.LevelInfo, "rpc", slog.String("method", "/m"), slog.Int("n", 3), tt.attr)
			if out := buf.String(); strings.Contains(out, distinctive) || !strings.Contains(out, tt.want) ||
				!strings.Contains(out, `"method":"/m","n":3`) {
				t.Errorf("log line %s; want %s, and the other attributes", out, tt.want)
			}
		})
	}
}
