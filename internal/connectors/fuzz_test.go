package connectors

import (
	"maps"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// These fuzz targets test the request checks as pure functions: they need
// no Postgres.

// fuzzTransports are the transports of fuzz input's numbers, as a front
// door reads the API's: 0 is none, past 3 a number it does not know.
var fuzzTransports = []string{"", store.TransportStdio, store.TransportSSE, store.TransportStreamableHTTP}

// fuzzConnector builds a connector from fuzz input, as a front door would
// give it. A timeout whose seconds and nanoseconds disagree in sign, or
// that is out of the API's range, is malformed, as the API's is.
func fuzzConnector(transport int32, rawURL, header, headerValue, command, arg, envKey, envValue string,
	timeoutSec int64, timeoutNanos int32, rps float64, burst int32) *Spec {
	sp := &Spec{ConnectorID: "c", RateLimit: &store.RateLimit{RequestsPerSecond: rps, Burst: int(burst)}}
	if transport >= 0 && int(transport) < len(fuzzTransports) {
		sp.Transport.Value = fuzzTransports[transport]
	} else {
		sp.Transport.Unknown = transport
	}
	if timeoutSec < -315576000000 || timeoutSec > 315576000000 || timeoutNanos <= -1e9 || timeoutNanos >= 1e9 ||
		(timeoutSec > 0 && timeoutNanos < 0) || (timeoutSec < 0 && timeoutNanos > 0) {
		sp.CallTimeout.Malformed = true
	} else {
		sp.CallTimeout.D = time.Duration(timeoutSec)*time.Second + time.Duration(timeoutNanos)
	}
	if transport%2 == 1 { // stdio, and an odd unknown value
		sp.Stdio = &Stdio{Command: command, Args: []string{arg}, Env: map[string]string{envKey: envValue}}
	} else {
		sp.HTTP = &HTTP{URL: rawURL, Headers: map[string]string{header: headerValue}}
	}
	return sp
}

func validate(sp *Spec) string {
	if bad := Check(sp); len(bad) > 0 {
		return (&InvalidError{Violations: bad}).Error()
	}
	return ""
}

// FuzzConnectorValidation feeds connector configs to the checks of
// Create and Update. They must never panic; their
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
		if msg != "" || p.HTTP == nil {
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
	if ValidQuery(query) {
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
func checkURLRoundTrip(t *testing.T, p *Spec) {
	t.Helper()
	orig := p.HTTP.URL
	stored := config(p).URL
	vals, err := secretsOf(p, nil)
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

// topFields are the Spec fields of the top-level paths of UpdatePaths.
var topFields = map[string]string{
	"name": "Name", "description": "Description", "transport": "Transport", "stdio": "Stdio", "http": "HTTP",
	"connect_timeout": "ConnectTimeout", "call_timeout": "CallTimeout", "session_mode": "SessionMode", "model": "Model",
	"rate_limit": "RateLimit", "disable_new_tools": "DisableNewTools", "narrow_tools_above": "NarrowToolsAbove",
	"protocol_preference": "ProtocolPreference", "approval_policy": "ApprovalPolicy", "auth": "Auth",
	"elicitation": "Elicitation", "sampling": "Sampling",
}

// unnamed is a copy of sp without the fields paths name: a path names its
// top-level field, and any connection path names both connections (it
// may switch).
func unnamed(sp *Spec, paths []string) Spec {
	out := *sp
	v := reflect.ValueOf(&out).Elem()
	for _, p := range paths {
		top, _, _ := strings.Cut(p, ".")
		tops := []string{top}
		if top == "stdio" || top == "http" {
			tops = []string{"stdio", "http"}
		}
		for _, name := range tops {
			v.FieldByName(topFields[name]).SetZero()
		}
	}
	return out
}

// deepCopy is a copy of sp that shares nothing merge may change with it.
func deepCopy(sp *Spec) *Spec {
	out := *sp
	if sp.Stdio != nil {
		s := *sp.Stdio
		out.Stdio = &s
	}
	if sp.HTTP != nil {
		h := *sp.HTTP
		out.HTTP = &h
	}
	return &out
}

// FuzzUpdateMask feeds update masks and connectors to the merge of
// Update. It must never panic, must leave every field the mask does not
// name as it was, and says secrets were replaced only when the mask
// replaces a connection, its headers or its env.
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
			paths = append(paths, UpdatePaths[int(b)%len(UpdatePaths)])
		}
		stored := &Spec{ConnectorID: "c", Name: "old", Transport: Choice{Value: store.TransportStreamableHTTP},
			HTTP: &HTTP{URL: "http://h/mcp?k=REDACTED", HeaderNames: []string{"X-Old"}}}
		if storedStdio {
			stored.Transport, stored.HTTP = Choice{Value: store.TransportStdio}, nil
			stored.Stdio = &Stdio{Command: "npx", EnvKeys: []string{"OLD"}}
		}
		src := fuzzConnector(int32(len(mask)%4), rawURL, header, headerValue, command, "arg", envKey, envValue, 5, 0, 1, 1)
		src.Name = name
		dst := deepCopy(stored)
		m, err := merge(dst, src, paths)
		if err == nil && validate(dst) == "" {
			_ = config(dst)
		}

		named := func(ps ...string) bool {
			return slices.ContainsFunc(paths, func(p string) bool { return slices.Contains(ps, p) })
		}
		if a, b := unnamed(stored, paths), unnamed(dst, paths); !reflect.DeepEqual(a, b) {
			t.Errorf("paths %v changed fields they do not name:\n%+v\n%+v", paths, a, b)
		}
		if !named("http", "http.headers") && dst.HTTP != nil && stored.HTTP != nil &&
			!slices.Equal(dst.HTTP.HeaderNames, stored.HTTP.HeaderNames) {
			t.Errorf("paths %v lost the stored header names", paths)
		}
		if m.secretsReplaced && !named("stdio", "http", "stdio.env", "http.headers") {
			t.Errorf("paths %v reported secrets replaced", paths)
		}
	})
}
