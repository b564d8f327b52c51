package server_test

import (
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/server"
)

// TestProtocolPreference: a connector's protocol_preference decides the
// generation its connection negotiates with a server that offers both;
// GetConnector shows the preference and the version, and the server sees
// that version on the calls. An update reconnects with the new one.
func TestProtocolPreference(t *testing.T) {
	f := setup(t)
	for _, tc := range []struct {
		id      string
		pref    connectorv1.ProtocolPreference
		shown   connectorv1.ProtocolPreference
		version string
	}{
		{"unset", connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_UNSPECIFIED,
			connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_AUTO, mcp.ProtocolVersion20251125},
		{"auto", connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_AUTO,
			connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_AUTO, mcp.ProtocolVersion20251125},
		{"classic", connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC,
			connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_CLASSIC, mcp.ProtocolVersion20251125},
		{"sessionless", connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS,
			connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS, mcp.ProtocolVersion20260728},
	} {
		t.Run(tc.id, func(t *testing.T) {
			srv := newTestMCP(t)
			c := mcpConnector(tc.id, srv.url())
			c.ProtocolPreference = tc.pref
			f.create(t, "ws", c)
			got := f.waitReady(t, "ws", tc.id)
			if got.GetProtocolPreference() != tc.shown || got.GetHealth().GetProtocolVersion() != tc.version {
				t.Errorf("connector shows protocol_preference %v, protocol_version %q; want %v, %q", got.GetProtocolPreference(),
					got.GetHealth().GetProtocolVersion(), tc.shown, tc.version)
			}
			if _, err := f.call(t, "ws", tc.id, "echo", map[string]any{"text": "hi"}); err != nil {
				t.Fatal(err)
			}
			if v := lastCallVersion(srv); v != tc.version {
				t.Errorf("the server saw tools/call at version %q, want %q", v, tc.version)
			}
		})
	}

	t.Run("update", func(t *testing.T) {
		srv := newTestMCP(t)
		f.create(t, "ws", mcpConnector("changed", srv.url()))
		f.waitReady(t, "ws", "changed")
		if _, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
			Connector: &connectorv1.Connector{ConnectorId: "changed",
				ProtocolPreference: connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"protocol_preference"}}}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := f.call(t, "ws", "changed", "echo", map[string]any{"text": "hi"}); err != nil {
				t.Fatal(err)
			}
			if lastCallVersion(srv) == mcp.ProtocolVersion20260728 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("calls still at version %q after the update to sessionless", lastCallVersion(srv))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// lastCallVersion is the protocol version of the last tools/call the
// server got.
func lastCallVersion(srv *testMCP) string {
	h := srv.toolCallHeaders()
	if len(h) == 0 {
		return ""
	}
	return h[len(h)-1].Get("Mcp-Protocol-Version")
}

// TestProtocolPreferenceValidated: an unknown value, and the sessionless
// generation for a per_session connector over streamable HTTP (whose caller
// sessions are MCP sessions), are refused naming the field, on create and
// on update.
func TestProtocolPreferenceValidated(t *testing.T) {
	f := setup(t)
	srv := newTestMCP(t)
	inactive := false
	create := func(c *connectorv1.Connector) error {
		_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: c, Active: &inactive})
		return err
	}
	unknown := mcpConnector("unknown", srv.url())
	unknown.ProtocolPreference = 7
	wantStatus(t, create(unknown), codes.InvalidArgument, server.ReasonInvalidArgument, "connector.protocol_preference")

	perSession := mcpConnector("per-session", srv.url())
	perSession.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION
	perSession.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS
	wantStatus(t, create(perSession), codes.InvalidArgument, server.ReasonInvalidArgument, "connector.protocol_preference")

	// Over SSE a session is the event stream itself: either generation
	// keeps callers apart.
	sse := mcpConnector("sse", srv.url())
	sse.Transport = connectorv1.Transport_TRANSPORT_SSE
	sse.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION
	sse.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS
	if err := create(sse); err != nil {
		t.Errorf("per_session SSE connector preferring sessionless: %v", err)
	}

	perSession.ProtocolPreference = connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_AUTO
	if err := create(perSession); err != nil {
		t.Fatal(err)
	}
	_, err := f.client.UpdateConnector(ctx(t), &connectorv1.UpdateConnectorRequest{WorkspaceId: "ws",
		Connector: &connectorv1.Connector{ConnectorId: "per-session",
			ProtocolPreference: connectorv1.ProtocolPreference_PROTOCOL_PREFERENCE_SESSIONLESS},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"protocol_preference"}}})
	wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "connector.protocol_preference")
}
