package connectors_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

func validHTTP() *connectors.Spec {
	return &connectors.Spec{ConnectorID: "c", Transport: connectors.Choice{Value: store.TransportStreamableHTTP},
		HTTP: &connectors.HTTP{URL: "http://127.0.0.1:9/mcp"}}
}

func with(f func(sp *connectors.Spec)) *connectors.Spec {
	sp := validHTTP()
	f(sp)
	return sp
}

// Check names each broken rule by its field's path in the API's request,
// with the message every front door gives.
func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		name string
		sp   *connectors.Spec
		want string // the whole message; "" is valid
	}{
		{"valid", validHTTP(), ""},
		{"no transport", with(func(sp *connectors.Spec) { sp.Transport = connectors.Choice{} }),
			"connector.transport: required: one of TRANSPORT_STDIO, TRANSPORT_SSE, TRANSPORT_STREAMABLE_HTTP"},
		{"unknown transport", with(func(sp *connectors.Spec) { sp.Transport = connectors.Choice{Unknown: 9} }),
			"connector.transport: unknown value 9: use TRANSPORT_STDIO, TRANSPORT_SSE or TRANSPORT_STREAMABLE_HTTP"},
		{"stdio with http", with(func(sp *connectors.Spec) { sp.Transport.Value = store.TransportStdio }),
			"connector.http: not used by TRANSPORT_STDIO; set connector.stdio; connector.stdio: required for TRANSPORT_STDIO"},
		{"sse without http", with(func(sp *connectors.Spec) { sp.Transport.Value, sp.HTTP = store.TransportSSE, nil }),
			"connector.http: required for TRANSPORT_SSE"},
		{"url with credentials", with(func(sp *connectors.Spec) { sp.HTTP.URL = "https://user:pw@x/mcp" }),
			"connector.http.url: must not carry credentials; put them in connector.http.headers"},
		{"bad query", with(func(sp *connectors.Spec) { sp.HTTP.URL = "https://x/mcp?k=caf\u00e9-secret" }),
			"connector.http.url: the query string must be name=value pairs joined by '&', percent-encoded"},
		{"header value", with(func(sp *connectors.Spec) { sp.HTTP.Headers = map[string]string{"X-Key": "a\r\nb-secret"} }),
			"connector.http.headers[X-Key]: value contains a line break or NUL byte"},
		{"malformed and huge timeouts", with(func(sp *connectors.Spec) {
			sp.ConnectTimeout.Malformed, sp.CallTimeout.D = true, 48*time.Hour
		}), "connector.connect_timeout: not a valid duration; connector.call_timeout: must be at most 1h0m0s"},
		{"unknown session mode", with(func(sp *connectors.Spec) { sp.SessionMode.Unknown = 7 }),
			"connector.session_mode: unknown value 7"},
		{"sessionless per session", with(func(sp *connectors.Spec) {
			sp.ProtocolPreference.Value, sp.SessionMode.Value = registry.ProtocolSessionless, registry.SessionPerSession
		}), "connector.protocol_preference: PROTOCOL_PREFERENCE_SESSIONLESS has no MCP sessions"},
		{"client credentials without client", with(func(sp *connectors.Spec) {
			sp.Auth = &connectors.Auth{Mode: connectors.Choice{Value: store.AuthClientCredentials}}
		}), "connector.auth.client_id: required for AUTH_MODE_OAUTH_CLIENT_CREDENTIALS; " +
			"connector.auth.client_secret: required for AUTH_MODE_OAUTH_CLIENT_CREDENTIALS"},
		{"oauth user and an Authorization header", with(func(sp *connectors.Spec) {
			sp.Auth = &connectors.Auth{Mode: connectors.Choice{Value: store.AuthUser}}
			sp.HTTP.HeaderNames = []string{"authorization"}
		}), "connector.http.headers: an Authorization header cannot go with AUTH_MODE_OAUTH_USER"},
		{"scopes without OAuth", with(func(sp *connectors.Spec) { sp.Auth = &connectors.Auth{Scopes: []string{"a", "a"}} }),
			`connector.auth.scopes[1]: repeats connector.auth.scopes[0] ("a"): name each scope once; ` +
				"connector.auth.scopes: AUTH_MODE_NONE uses no OAuth, so scopes would go unused"},
		{"elicitation on a shared connection", with(func(sp *connectors.Spec) { sp.Elicitation = true }),
			"connector.elicitation: servers ask the user of a connection"},
		{"sampling limits", with(func(sp *connectors.Spec) {
			sp.Sampling = &connectors.Sampling{Policy: connectors.Choice{Unknown: 5}, MaxTokensPerRun: -1}
		}), "connector.sampling.policy: unknown value 5: use SAMPLING_POLICY_AUTO or SAMPLING_POLICY_APPROVE; " +
			"connector.sampling.max_tokens_per_run: must be between 0 and 1000000 (0 uses the service's default)"},
	} {
		bad := connectors.Check(tt.sp)
		got := ""
		if len(bad) > 0 {
			got = (&connectors.InvalidError{Violations: bad}).Error()
		}
		switch {
		case tt.want == "":
			if got != "" {
				t.Errorf("%s: %q, want valid", tt.name, got)
			}
		case !strings.HasPrefix(got, "invalid request: "+tt.want):
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, "invalid request: "+tt.want)
		}
		if strings.Contains(got, "secret") && !strings.Contains(tt.want, "secret") {
			t.Errorf("%s: the message %q holds a secret value", tt.name, got)
		}
	}
}

// A new connector without a name is named by its id.
func TestCheckNewNamesByID(t *testing.T) {
	sp := with(func(sp *connectors.Spec) { sp.ConnectorID = strings.Repeat("c", 201) })
	bad := connectors.CheckNew(sp)
	if sp.Name != sp.ConnectorID || len(bad) != 2 || bad[0].Field != "connector.connector_id" || bad[1].Field != "connector.name" {
		t.Errorf("CheckNew named the connector %q and found %v", sp.Name, bad)
	}
}

// An update is merged into the stored connector and checked as a whole;
// an invalid result, or a path under a connection the connector does not
// have, writes nothing.
func TestUpdateChecksTheMergedConnector(t *testing.T) {
	db := storetest.NewDB(t)
	_, lv := livetest.Run(t, db)
	box, err := secret.NewBox(bytes.Repeat([]byte{5}, 32))
	if err != nil {
		t.Fatal(err)
	}
	svc := connectors.New(connectors.Deps{Store: db, Live: lv, Box: box})
	ctx := t.Context()
	if _, err := svc.Create(ctx, httpConnector("a", "http://127.0.0.1:9/mcp?k=v")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		spec  *connectors.Spec
		paths []string
		want  string
	}{
		{&connectors.Spec{}, []string{"stdio.command"},
			`update_mask: path "stdio.command": the connector has no stdio config; use path "stdio" to replace the connection`},
		{&connectors.Spec{Transport: connectors.Choice{Value: store.TransportStdio}}, []string{"transport"},
			"connector.http: not used by TRANSPORT_STDIO; set connector.stdio; connector.stdio: required for TRANSPORT_STDIO"},
		{&connectors.Spec{HTTP: &connectors.HTTP{URL: "http://127.0.0.1:9/mcp?other=REDACTED"}}, []string{"http.url"},
			`connector.http.url: query parameter "other" is REDACTED, the placeholder responses show`},
	} {
		_, err := svc.Update(ctx, connectors.Update{WorkspaceID: "ws", ConnectorID: "a", Spec: tt.spec, Paths: tt.paths})
		var invalid *connectors.InvalidError
		if !errors.As(err, &invalid) || !strings.HasPrefix(err.Error(), "invalid request: "+tt.want) {
			t.Errorf("Update of %v = %v, want %q", tt.paths, err, tt.want)
		}
	}
	// The URL pasted back as shown keeps its query value.
	updated, err := svc.Update(ctx, connectors.Update{WorkspaceID: "ws", ConnectorID: "a", Paths: []string{"http.url", "name"},
		Spec: &connectors.Spec{Name: "renamed", HTTP: &connectors.HTTP{URL: "http://127.0.0.1:9/mcp?k=REDACTED"}}})
	if err != nil || updated.Name != "renamed" || updated.Config.URL != "http://127.0.0.1:9/mcp?k=REDACTED" {
		t.Fatalf("Update = %+v, %v", updated, err)
	}
}
