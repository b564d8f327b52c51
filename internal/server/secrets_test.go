package server_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/llm/llmtest"
	"github.com/connector-svc/connector-svc/internal/server"
	"github.com/connector-svc/connector-svc/internal/store"
)

// TestURLQueryValuesAreSecrets runs a connector whose URL carries its key,
// as many hosted MCP servers want it: the server gets the whole URL, and
// nothing the service shows, logs or stores in the clear holds the values.
func TestURLQueryValuesAreSecrets(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	var shown []string
	show := func(c *connectorv1.Connector) {
		b, _ := protojson.Marshal(c)
		shown = append(shown, string(b))
	}
	// wantServerGot calls a tool and checks the query and X-Key header the
	// MCP server got with it.
	wantServerGot := func(query, key string) {
		t.Helper()
		if _, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "hi"}); err != nil {
			t.Fatal(err)
		}
		last := srv.last.Load()
		if last.URL.RawQuery != query || last.Header.Get("X-Key") != key {
			t.Errorf("the MCP server got query %q and X-Key %q, want %q and %q", last.URL.RawQuery, last.Header.Get("X-Key"), query, key)
		}
	}

	c := mcpConnector("m", srv.url()+"?api_key="+distinctive+"&team=a%2Fb&api_key=second")
	c.GetHttp().Headers = map[string]string{"X-Key": "k1"}
	f.create(t, "ws", c)
	show(f.waitReady(t, "ws", "m"))
	wantServerGot("api_key="+distinctive+"&team=a%2Fb&api_key=second", "k1")
	wantURL := srv.url() + "?api_key=REDACTED&team=REDACTED&api_key=REDACTED"
	list, err := f.client.ListConnectors(ctx(t), &connectorv1.ListConnectorsRequest{WorkspaceId: "ws"})
	if err != nil {
		t.Fatal(err)
	}
	if got := list.GetConnectors()[0].GetHttp().GetUrl(); got != wantURL {
		t.Errorf("listed url = %q, want %q", got, wantURL)
	}
	show(list.GetConnectors()[0])
	row, err := f.db.GetConnector(ctx(t), "ws", "m")
	if err != nil {
		t.Fatal(err)
	}
	if config, _ := json.Marshal(row.Config); row.Config.URL != wantURL || bytes.Contains(config, []byte(distinctive)) ||
		bytes.Contains(row.SealedSecrets, []byte(distinctive)) {
		t.Errorf("stored config %s holds the query values, or the sealed secrets hold the plaintext", config)
	}

	// New headers keep the query values.
	upd, err := update(f, t, &connectorv1.Connector{ConnectorId: "m",
		Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Headers: map[string]string{"X-Key": "k2"}}}}, "http.headers")
	if err != nil {
		t.Fatal(err)
	}
	show(upd)
	wantServerGot("api_key="+distinctive+"&team=a%2Fb&api_key=second", "k2")

	// The URL as shown, pasted back with one value changed: REDACTED keeps
	// each value, repeated names in order, and the headers stay.
	upd, err = update(f, t, mcpConnector("m", srv.url()+"?api_key=REDACTED&team=c&api_key=REDACTED"), "http.url")
	if err != nil {
		t.Fatal(err)
	}
	show(upd)
	wantServerGot("api_key="+distinctive+"&team=c&api_key=second", "k2")

	// New values replace the old ones.
	upd, err = update(f, t, mcpConnector("m", srv.url()+"?api_key=new"), "http.url")
	if err != nil {
		t.Fatal(err)
	}
	show(upd)
	wantServerGot("api_key=new", "k2")
	if got := upd.GetHttp().GetUrl(); got != srv.url()+"?api_key=REDACTED" {
		t.Errorf("url after update = %q", got)
	}

	// REDACTED with nothing to keep is refused, and nothing changes.
	for _, url := range []string{srv.url() + "?other=REDACTED", srv.url() + "?api_key=REDACTED&api_key=REDACTED"} {
		_, err = update(f, t, mcpConnector("m", url), "http.url")
		wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.http.url")
	}
	_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws",
		Connector: mcpConnector("copy", srv.url()+"?api_key=REDACTED")})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.http.url")
	if msg := status.Convert(err).Message(); !strings.Contains(msg, `"api_key"`) {
		t.Errorf("message %q does not name the parameter", msg)
	}
	wantServerGot("api_key=new", "k2")

	for i, s := range shown {
		if strings.Contains(s, distinctive) || strings.Contains(s, "second") {
			t.Errorf("response %d shows a query value: %s", i, s)
		}
	}
	if strings.Contains(f.logs.String(), distinctive) {
		t.Error("the service's logs contain the query value")
	}
}

// TestToolCallErrorsHideQueryValues breaks the MCP server under a query:
// the failed call's error, which carries the URL, reaches the model and the
// trace with the query values redacted.
func TestToolCallErrorsHideQueryValues(t *testing.T) {
	srv := newTestMCP(t)
	stopThenCall := func(req openai.ChatCompletionRequest) llmtest.Reply {
		srv.http.CloseClientConnections()
		srv.http.Close()
		return llmtest.CallTools(llmtest.Call{Tool: "echo", Args: `{"text":"x"}`})(req)
	}
	model := llmtest.New(t, stopThenCall, llmtest.Answer("the tool failed"))
	f := setup(t, options{llmURL: model.URL()})
	f.create(t, "ws", mcpConnector("m", srv.url()+"?api_key="+distinctive))
	f.waitReady(t, "ws", "m")

	res, err := f.query(t, &connectorv1.QueryConnectorRequest{Query: "echo x"})
	if err != nil {
		t.Fatal(err)
	}
	if call := res.GetSteps()[0].GetCalls()[0]; !call.GetIsError() || !strings.Contains(call.GetResultExcerpt(), "api_key=REDACTED") {
		t.Errorf("failed call = %v; want an error that shows the URL redacted", call)
	}
	sent, _ := json.Marshal(model.Requests())
	if b, _ := protojson.Marshal(res); strings.Contains(string(sent), distinctive) || strings.Contains(string(b), distinctive) {
		t.Error("the query value reached the model or the query's result")
	}
}

// TestURLQueryStoredInTheClear covers a connector stored before query
// values were sealed: its URL still works and is shown redacted, and its
// next update seals the values.
func TestURLQueryStoredInTheClear(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	_, err := f.db.CreateConnector(ctx(t), &store.Connector{WorkspaceID: "ws", ExternalID: "m", Name: "m",
		Transport: store.TransportStreamableHTTP, Config: store.Config{URL: srv.url() + "?api_key=" + distinctive,
			ConnectTimeout: store.Duration(server.DefaultConnectTimeout), CallTimeout: store.Duration(server.DefaultCallTimeout)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "m"}); err != nil {
		t.Fatal(err)
	}
	if got := f.waitReady(t, "ws", "m").GetHttp().GetUrl(); got != srv.url()+"?api_key=REDACTED" {
		t.Errorf("url = %q", got)
	}

	if _, err := update(f, t, &connectorv1.Connector{ConnectorId: "m", Name: "renamed"}, "name"); err != nil {
		t.Fatal(err)
	}
	row, err := f.db.GetConnector(ctx(t), "ws", "m")
	if err != nil {
		t.Fatal(err)
	}
	if row.Config.URL != srv.url()+"?api_key=REDACTED" || len(row.SealedSecrets) == 0 {
		t.Errorf("after an update the row holds url %q and %d bytes of sealed secrets; want the values sealed", row.Config.URL, len(row.SealedSecrets))
	}
	if _, err := f.call(t, "ws", "m", "echo", map[string]any{"text": "hi"}); err != nil {
		t.Fatal(err)
	}
	if got := srv.last.Load().URL.Query().Get("api_key"); got != distinctive {
		t.Errorf("the MCP server got api_key %q, want the stored value", got)
	}
}
