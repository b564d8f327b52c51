package server

import (
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/secret"
)

// These fuzz targets test the request checks as pure functions: they need
// no Postgres.

// fuzzConnector builds a connector from fuzz input, as a request would
// carry it.
func fuzzConnector(transport int32, rawURL, header, headerValue, command, arg, envKey, envValue string,
	timeoutSec int64, timeoutNanos int32, rps float64, burst int32) *connectorv1.Connector {
	p := &connectorv1.Connector{
		ConnectorId: "c", Transport: connectorv1.Transport(transport),
		CallTimeout: &durationpb.Duration{Seconds: timeoutSec, Nanos: timeoutNanos},
		RateLimit:   &connectorv1.RateLimit{RequestsPerSecond: rps, Burst: burst},
	}
	if transport%2 == 1 { // stdio, and an odd unknown value
		p.Connection = &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{
			Command: command, Args: []string{arg}, Env: map[string]string{envKey: envValue}}}
	} else {
		p.Connection = &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{
			Url: rawURL, Headers: map[string]string{header: headerValue}}}
	}
	return p
}

func validate(p *connectorv1.Connector) string {
	var c checker
	c.connector(p)
	if err := c.err(); err != nil {
		return err.Error()
	}
	return ""
}

// FuzzConnectorValidation feeds connector configs to the checks of
// CreateConnector and UpdateConnector. They must never panic; their
// message must not depend on secret values (header, env and URL query
// values), only on whether those are valid; and a URL they accept must
// reach the MCP server as written once its query values are split off to
// be sealed and joined back, with nothing secret left in what is stored.
func FuzzConnectorValidation(f *testing.F) {
	type seed struct {
		transport                                                int32
		url, header, headerValue, command, arg, envKey, envValue string
	}
	for _, s := range []seed{
		{3, "https://mcp.example.com/v1/mcp?api_key=sk-123&team=a%2Fb", "Authorization", "Bearer sk-1", "", "", "", ""},
		{2, "http://127.0.0.1:3001/sse#frag?x=1", "X-Key", "v\r\nInjected: 1", "", "", "", ""},
		{3, "http://h/?next=/a?b=c&flag&empty=", "Bad Name", "v", "", "", "", ""},
		{3, "http://h/?a=1;b=2", "X", "secret-value-123", "", "", "", ""},
		{3, "http://h/?q=caf\u00e9", "X", "v", "", "", "", ""},
		{3, "http://user:pw@h/mcp", "X", "v", "", "", "", ""},
		{3, "http://:3001/mcp", "X", "v", "", "", "", ""},
		{3, "http://[fe80::1%25eth0]:80/mcp?k=REDACTED", "X", "v", "", "", "", ""},
		{3, "HTTP://H/mcp?k=%zz", "X", "v", "", "", "", ""},
		{3, "ftp://h/", "", "", "", "", "", ""},
		{3, "http://h/\x7f?k=v", "X", "v", "", "", "", ""},
		{1, "", "", "", "npx", "-y", "API_KEY", "sk-secret"},
		{1, "", "", "", "npx -y server", "a\x00b", "A=B", "x\x00y"},
		{1, "", "", "", "", "", "", ""},
		{0, "http://h/mcp", "X", "v", "", "", "", ""},
		{7, "http://h/mcp", "X", "v", "", "", "", ""},
	} {
		f.Add(s.transport, s.url, s.header, s.headerValue, s.command, s.arg, s.envKey, s.envValue, int64(30), int32(0), 1.5, int32(2))
	}
	f.Add(int32(3), "http://h/mcp", "X", "v", "", "", "", "", int64(-1), int32(-5), -1.0, int32(-1))
	f.Add(int32(3), "http://h/mcp", "X", "v", "", "", "", "", int64(1<<40), int32(2e9), 1e308, int32(0))
	f.Fuzz(func(t *testing.T, transport int32, rawURL, header, headerValue, command, arg, envKey, envValue string,
		timeoutSec int64, timeoutNanos int32, rps float64, burst int32) {
		for _, s := range []string{rawURL, header, headerValue, command, arg, envKey, envValue} {
			if !utf8.ValidString(s) {
				return // gRPC refuses a request whose strings are not UTF-8
			}
		}
		p := fuzzConnector(transport, rawURL, header, headerValue, command, arg, envKey, envValue, timeoutSec, timeoutNanos, rps, burst)
		msg := validate(p)

		// The same connector with other secret values of the same validity
		// gets the same message.
		same := fuzzConnector(transport, sameValidityURL(rawURL), header, sameValidity(headerValue, "\r\n\x00"),
			command, arg, envKey, sameValidity(envValue, "\x00"), timeoutSec, timeoutNanos, rps, burst)
		if other := validate(same); other != msg {
			t.Errorf("the message depends on secret values:\n%q\n%q", msg, other)
		}
		if msg != "" || p.GetHttp() == nil {
			return
		}
		checkURLRoundTrip(t, p)
	})
}

// sameValidity is a stand-in for v: a line break or NUL if v holds one of
// bad (which makes it invalid), else a plain word.
func sameValidity(v, bad string) string {
	if i := strings.IndexAny(v, bad); i >= 0 {
		return string(v[i])
	}
	return "placeholder"
}

// sameValidityURL replaces the query values of a URL that parses: by
// "x" in a valid query, by an invalid query otherwise.
func sameValidityURL(raw string) string {
	if _, err := url.Parse(raw); err != nil {
		return raw
	}
	rest, frag, hasFrag := strings.Cut(raw, "#")
	head, query, hasQuery := strings.Cut(rest, "?")
	if !hasQuery {
		return raw
	}
	if validQuery(query) {
		_, params := secret.SplitURL("?" + query)
		for i := range params {
			if params[i].Value != "" {
				params[i].Value = "x"
			}
		}
		query = strings.TrimPrefix(secret.JoinURL("", params), "?")
	} else {
		query = "%zz"
	}
	out := head + "?" + query
	if hasFrag {
		out += "#" + frag
	}
	return out
}

// checkURLRoundTrip checks that an accepted URL, split into what is
// stored and what is sealed, joins back into the URL the operator gave.
func checkURLRoundTrip(t *testing.T, p *connectorv1.Connector) {
	t.Helper()
	orig := p.GetHttp().GetUrl()
	stored := configFromProto(p).URL
	vals, err := secretsFromProto(proto.CloneOf(p), nil)
	if err != nil {
		return // a REDACTED value with nothing to keep: refused, as it should be
	}
	joined := secret.JoinURL(stored, vals.Query)
	want, err1 := url.Parse(orig)
	got, err2 := url.Parse(joined)
	if err1 != nil || err2 != nil {
		t.Fatalf("url.Parse(%q) = %v; url.Parse(%q) = %v", orig, err1, joined, err2)
	}
	wantQ, _ := url.ParseQuery(want.RawQuery)
	gotQ, _ := url.ParseQuery(got.RawQuery)
	if got.Scheme != want.Scheme || got.Host != want.Host || got.EscapedPath() != want.EscapedPath() ||
		got.Fragment != want.Fragment || !maps.EqualFunc(gotQ, wantQ, slices.Equal) {
		t.Errorf("accepted %q, but the MCP server would get %q", orig, joined)
	}
	s, err := url.Parse(stored)
	if err != nil || s.Host != want.Host {
		t.Fatalf("stored URL %q (%v) does not name the host of %q", stored, err, orig)
	}
	storedQ, _ := url.ParseQuery(s.RawQuery)
	for name, vs := range storedQ {
		for _, v := range vs {
			if v != "" && v != secret.Redacted {
				t.Errorf("stored URL %q keeps the value of %q in the clear", stored, name)
			}
		}
	}
}

// unnamed is c without the fields paths name: a path names its top-level
// field, and any connection path names both connections (it may switch).
func unnamed(c *connectorv1.Connector, paths []string) *connectorv1.Connector {
	out := proto.CloneOf(c)
	m := out.ProtoReflect()
	for _, p := range paths {
		top, _, _ := strings.Cut(p, ".")
		tops := []string{top}
		if top == "stdio" || top == "http" {
			tops = []string{"stdio", "http"}
		}
		for _, name := range tops {
			m.Clear(m.Descriptor().Fields().ByName(protoreflect.Name(name)))
		}
	}
	return out
}

// FuzzUpdateMask feeds update masks and connectors to the merge of
// UpdateConnector. It must never panic, must leave every field the mask
// does not name as it was, and says secrets were replaced only when the
// mask replaces a connection, its headers or its env.
func FuzzUpdateMask(f *testing.F) {
	f.Add([]byte{0}, false, "new name", "http://h/mcp?k=REDACTED", "X", "v", "npx", "K", "v")
	f.Add([]byte{8}, false, "", "http://other/mcp", "", "", "", "", "")
	f.Add([]byte{9, 1}, false, "", "", "Authorization", "Bearer x", "", "", "")
	f.Add([]byte{4, 5, 6}, true, "", "", "", "", "uvx", "TOKEN", "t")
	f.Add([]byte{2, 3}, false, "", "", "", "", "npx", "", "")
	f.Add([]byte{2, 7}, true, "", "http://h/mcp", "", "", "", "", "")
	f.Add([]byte{6, 6, 3, 255}, true, "", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, mask []byte, storedStdio bool, name, rawURL, header, headerValue, command, envKey, envValue string) {
		var paths []string
		for _, b := range mask {
			paths = append(paths, updatePaths[int(b)%len(updatePaths)])
		}
		stored := &connectorv1.Connector{ConnectorId: "c", Name: "old", Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP,
			Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: "http://h/mcp?k=REDACTED", HeaderNames: []string{"X-Old"}}}}
		if storedStdio {
			stored.Transport = connectorv1.Transport_TRANSPORT_STDIO
			stored.Connection = &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: "npx", EnvKeys: []string{"OLD"}}}
		}
		src := fuzzConnector(int32(len(mask)%4), rawURL, header, headerValue, command, "arg", envKey, envValue, 5, 0, 1, 1)
		src.Name = name
		dst := proto.CloneOf(stored)
		replaced, _, err := mergeMasked(dst, src, paths)
		if err == nil && validate(dst) == "" {
			_ = configFromProto(dst)
		}

		named := func(ps ...string) bool {
			return slices.ContainsFunc(paths, func(p string) bool { return slices.Contains(ps, p) })
		}
		if a, b := unnamed(stored, paths), unnamed(dst, paths); !proto.Equal(a, b) {
			t.Errorf("paths %v changed fields they do not name:\n%v\n%v", paths, a, b)
		}
		if !named("http", "http.headers") && dst.GetHttp() != nil && stored.GetHttp() != nil &&
			!slices.Equal(dst.GetHttp().GetHeaderNames(), stored.GetHttp().GetHeaderNames()) {
			t.Errorf("paths %v lost the stored header names", paths)
		}
		if replaced && !named("stdio", "http", "stdio.env", "http.headers") {
			t.Errorf("paths %v reported secrets replaced", paths)
		}
	})
}
