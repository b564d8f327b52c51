package server_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/server"
)

// replicaOAuth is one replica's view of a fakeOAuth the replicas share
// (as they share the database its tokens are in): each keeps its own
// Forget calls, as each process keeps its own token cache.
type replicaOAuth struct {
	*fakeOAuth
	mu      sync.Mutex
	forgets []string
}

func (r *replicaOAuth) Forget(connectorID int64, user string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgets = append(r.forgets, fmt.Sprintf("%d/%s", connectorID, user))
}

func (r *replicaOAuth) forgotten() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.forgets)
}

// Revoking a user's authorization on one replica closes their connection
// on the replica that holds it, while the token still authorizes the MCP
// session's DELETE, and has every replica forget the user's token, the
// one holding no connection of theirs included; the log line names the
// user.
func TestRevokeStopsTheUserOnEveryReplica(t *testing.T) {
	shared := newFakeOAuth()
	oa, ob := &replicaOAuth{fakeOAuth: shared}, &replicaOAuth{fakeOAuth: shared}
	a := setup(t, options{oauth: oa, replica: "replica-a"})
	b := setup(t, options{oauth: ob, replica: "replica-b", shared: a})
	waitReplicas(t, a, b)

	deletes := make(chan string, 10) // the Authorization of each DELETE the MCP server gets
	url := protectedMCPSeeing(t, func(r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes <- r.Header.Get("Authorization")
		}
	})
	a.create(t, "ws", oauthUserConnector("p", url))
	a.waitReachable(t, "ws", "p")
	b.waitReachable(t, "ws", "p")
	id, _ := a.reg.Lookup("ws", "p")
	shared.grant(id, "alice", "read")
	shared.grant(id, "bob", "read")

	// Alice's connection opens on a; her call on b is forwarded there.
	for _, f := range []*fixture{a, b} {
		if who, err := f.whoami(t, "p", "alice"); err != nil || who != "alice" {
			t.Fatalf("alice's whoami = %q, %v", who, err)
		}
	}
	if na, nb := a.reg.SessionCount(id), b.reg.SessionCount(id); na != 1 || nb != 0 {
		t.Fatalf("alice's connections: %d on a, %d on b; want 1 on a", na, nb)
	}

	// Revoked on b, which holds no connection of hers.
	if _, err := b.client.RevokeAuthorization(ctx(t), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: "ws", ConnectorId: "p",
		UserId: "alice"}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d/alice", id)
	for name, o := range map[string]*replicaOAuth{"a": oa, "b": ob} {
		if got := o.forgotten(); !slices.Contains(got, want) {
			t.Errorf("replica %s forgot %v, want %s", name, got, want)
		}
	}
	if n := a.reg.SessionCount(id); n != 0 {
		t.Errorf("alice's connections on a after the revocation: %d", n)
	}
	select {
	case got := <-deletes:
		if !strings.HasPrefix(got, "Bearer tok-alice:") {
			t.Errorf("the MCP session's DELETE carried %q, want alice's token", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the MCP server got no DELETE of alice's session: it was closed without her token")
	}
	for _, f := range []*fixture{a, b} {
		_, err := f.whoami(t, "p", "alice")
		authorizationRequired(t, err)
		if who, err := f.whoami(t, "p", "bob"); err != nil || who != "bob" {
			t.Errorf("bob after alice's revocation: %q, %v", who, err)
		}
	}
	if !strings.Contains(b.logs.String(), `"msg":"authorization revoked"`) ||
		!logLineHas(b.logs.String(), "authorization revoked", `"user_id":"alice"`) {
		t.Errorf("no \"authorization revoked\" log line naming user_id alice:\n%s", b.logs.String())
	}
}

// logLineHas reports whether a JSON log line with message msg contains s.
func logLineHas(logs, msg, s string) bool {
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, `"msg":"`+msg+`"`) && strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// A session or user id the service would refuse is refused before the
// call is routed: INVALID_ARGUMENT naming it, nothing claimed in the
// sessions table.
func TestCallerIDsCheckedBeforeRouting(t *testing.T) {
	fake := newFakeOAuth()
	f := setup(t, options{oauth: fake, replica: "replica-a"})
	f.create(t, "ws", oauthUserConnector("p", protectedMCP(t)))
	perSession := mcpConnector("s", "http://127.0.0.1:9/mcp")
	perSession.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION
	f.create(t, "ws", perSession)
	f.waitReachable(t, "ws", "p")

	type call struct {
		name string
		run  func(connector, session, user string) error
	}
	calls := []call{
		{"CallTool", func(c, s, u string) error {
			_, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: c, ToolName: "whoami",
				SessionId: s, UserId: u})
			return err
		}},
		{"StreamCallTool", func(c, s, u string) error {
			stream, err := f.client.StreamCallTool(ctx(t), &connectorv1.StreamCallToolRequest{WorkspaceId: "ws", ConnectorId: c,
				ToolName: "whoami", SessionId: s, UserId: u})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}},
		{"QueryConnector", func(c, s, u string) error {
			_, err := f.client.QueryConnector(ctx(t), &connectorv1.QueryConnectorRequest{WorkspaceId: "ws", ConnectorId: c,
				Query: "who am I?", SessionId: s, UserId: u})
			return err
		}},
		{"StreamQueryConnector", func(c, s, u string) error {
			stream, err := f.client.StreamQueryConnector(ctx(t), &connectorv1.StreamQueryConnectorRequest{WorkspaceId: "ws",
				ConnectorId: c, Query: "who am I?", SessionId: s, UserId: u})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}},
	}
	for _, c := range calls {
		for _, tt := range []struct {
			connector, session, user, field string
		}{
			{"p", "", "alice\x00", "user_id"},
			{"p", "", "\x01alice", "user_id"},
			{"p", "", "alice\u0085", "user_id"},
			{"s", "s-1\x00", "", "session_id"},
			{"s", "\x1bs-1", "", "session_id"},
		} {
			t.Run(fmt.Sprintf("%s/%q/%q", c.name, tt.session, tt.user), func(t *testing.T) {
				err := c.run(tt.connector, tt.session, tt.user)
				wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, tt.field)
			})
		}
	}
	if n := f.sessionRows(t); n != 0 {
		t.Errorf("sessions claimed for refused calls: %d", n)
	}
	// A well-formed user's call is routed, and claims their connection.
	fake.grant(mustLookup(t, f, "ws", "p"), "alice", "read")
	if who, err := f.whoami(t, "p", "alice"); err != nil || who != "alice" {
		t.Fatalf("alice's whoami = %q, %v", who, err)
	}
	if n := f.sessionRows(t); n != 1 {
		t.Errorf("sessions after alice's call: %d, want 1", n)
	}
}

func mustLookup(t *testing.T, f *fixture, ws, connector string) int64 {
	t.Helper()
	id, ok := f.reg.Lookup(ws, connector)
	if !ok {
		t.Fatalf("connector %s/%s is not in the registry", ws, connector)
	}
	return id
}

// sessionRows counts the rows of the sessions table.
func (f *fixture) sessionRows(t *testing.T) int {
	t.Helper()
	conn, err := pgx.Connect(ctx(t), f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx(t), `SELECT count(*) FROM sessions`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
