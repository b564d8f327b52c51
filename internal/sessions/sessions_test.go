package sessions_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/sessions"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// fakePeer is another replica holding one session, or failing.
type fakePeer struct {
	held   registry.SessionInfo
	fail   error
	closed []string
}

func (p *fakePeer) List(context.Context, string, string) ([]registry.SessionInfo, error) {
	if p.fail != nil {
		return nil, p.fail
	}
	return []registry.SessionInfo{p.held}, nil
}

func (p *fakePeer) Close(_ context.Context, _, _, sessionID string) ([]registry.SessionInfo, error) {
	if p.fail != nil {
		return nil, p.fail
	}
	p.closed = append(p.closed, sessionID)
	if sessionID != p.held.SessionID {
		return nil, nil
	}
	return []registry.SessionInfo{p.held}, nil
}

// A per_session connector on a real server with sessions s1 and s3 open
// here, s2 held by a peer and a second peer that does not answer: the
// list has all three, in order, and a close reaches every replica.
func TestListAndCloseAcrossReplicas(t *testing.T) {
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	ctx := context.Background()

	m := mcpserver.NewMCPServer("s", "1.0", mcpserver.WithToolCapabilities(true))
	m.AddTool(mcp.NewTool("echo"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	hs := httptest.NewServer(mcpserver.NewStreamableHTTPServer(m))
	t.Cleanup(hs.Close)
	row, err := db.CreateConnector(ctx, &store.Connector{WorkspaceID: "ws", ExternalID: "c", Name: "c", Active: true,
		Transport: store.TransportStreamableHTTP, Config: store.Config{URL: hs.URL + "/mcp", CallTimeout: store.Duration(10 * time.Second),
			SessionMode: registry.SessionPerSession}})
	if err != nil {
		t.Fatal(err)
	}
	lv.Apply(ctx, row)
	for _, sid := range []string{"s3", "s1"} {
		testsupport.WaitFor(t, "a call in session "+sid, func() bool {
			_, err := reg.CallTool(ctx, row.ID, "echo", nil, registry.CallOptions{Session: sid})
			return err == nil
		})
	}
	peer := &fakePeer{held: registry.SessionInfo{SessionID: "s2", ConnectorExternal: "c"}}
	down := &fakePeer{fail: errors.New("connection refused")}
	svc := sessions.New(sessions.Deps{Registry: reg, Live: lv, Store: db,
		Peers: func(context.Context) ([]sessions.Peer, error) { return []sessions.Peer{peer, down}, nil }})

	all, err := svc.List(ctx, "ws", "c")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range all {
		ids = append(ids, in.SessionID)
	}
	if len(ids) != 3 || ids[0] != "s1" || ids[1] != "s2" || ids[2] != "s3" {
		t.Fatalf("sessions %v, want [s1 s2 s3]", ids)
	}
	closed, err := svc.Close(ctx, "ws", "c", "s1")
	if err != nil || len(closed) != 1 || closed[0].SessionID != "s1" || len(peer.closed) != 1 {
		t.Fatalf("Close(s1) = %v, %v; the peer was asked %v", closed, err, peer.closed)
	}
	if closed, err = svc.Close(ctx, "ws", "c", "s2"); err != nil || len(closed) != 1 || closed[0].SessionID != "s2" {
		t.Fatalf("Close(s2), held by the peer = %v, %v", closed, err)
	}
	if _, err := svc.List(ctx, "ws", "nope"); !errors.Is(err, store.ErrConnectorNotFound) {
		t.Errorf("List of an unknown connector = %v, want ErrConnectorNotFound", err)
	}
}
