package connectors_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/live/livetest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
	"github.com/connector-svc/connector-svc/internal/store/storetest"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// setup runs a replica's live state on a real database, and the use case
// over it.
func setup(t *testing.T) (*connectors.Service, *live.Connectors, *registry.Registry) {
	t.Helper()
	db := storetest.NewDB(t)
	reg, lv := livetest.Run(t, db)
	return connectors.New(connectors.Deps{Store: db, Live: lv, AllowedCommands: []string{"npx"}}), lv, reg
}

func httpConnector(id, url string) connectors.NewConnector {
	return connectors.NewConnector{WorkspaceID: "ws", Active: true, Spec: &connectors.Spec{ConnectorID: id,
		Transport: connectors.Choice{Value: store.TransportStreamableHTTP}, HTTP: &connectors.HTTP{URL: url},
		CallTimeout: connectors.Timeout{D: 10 * time.Second}}}
}

// Every change is written and then applied: the live copy follows at
// once, without a change notification.
func TestChangesAreAppliedAtOnce(t *testing.T) {
	svc, lv, reg := setup(t)
	ctx := context.Background()
	c, err := svc.Create(ctx, httpConnector("a", "http://127.0.0.1:9/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	if row, ok := lv.Lookup("ws", "a"); !ok || row.ID != c.ID || !reg.Has(c.ID) {
		t.Fatalf("after Create: live row %v (%v), registry holds it: %v", row, ok, reg.Has(c.ID))
	}
	updated, err := svc.Update(ctx, connectors.Update{WorkspaceID: "ws", ConnectorID: "a", Paths: []string{"name"},
		Spec: &connectors.Spec{Name: "renamed"}})
	if err != nil || updated.Name != "renamed" {
		t.Fatalf("Update = %v, %v", updated, err)
	}
	if row, _ := lv.Lookup("ws", "a"); row.Name != "renamed" {
		t.Errorf("live row after Update named %q", row.Name)
	}
	if _, err := svc.SetActive(ctx, "ws", "a", false); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the registry to drop the deactivated connector", func() bool { return !reg.Has(c.ID) })
	if err := svc.Delete(ctx, "ws", "a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := lv.Lookup("ws", "a"); ok {
		t.Error("the live copy outlived Delete")
	}
	var nf *store.ConnectorNotFoundError
	if err := svc.Delete(ctx, "ws", "a"); !errors.As(err, &nf) || nf.ConnectorID != "a" {
		t.Errorf("a second Delete = %v, want ConnectorNotFoundError naming a", err)
	}
}

// The operator's rules refuse before anything is written.
func TestRulesRefuseBeforeWriting(t *testing.T) {
	svc, lv, _ := setup(t)
	ctx := context.Background()
	stdio := connectors.NewConnector{WorkspaceID: "ws", Active: true, Spec: &connectors.Spec{ConnectorID: "s",
		Transport: connectors.Choice{Value: store.TransportStdio}, Stdio: &connectors.Stdio{Command: "bash"}}}
	var notAllowed *connectors.CommandNotAllowedError
	if _, err := svc.Create(ctx, stdio); !errors.As(err, &notAllowed) || notAllowed.Command != "bash" {
		t.Errorf("Create of a stdio connector running bash = %v, want CommandNotAllowedError", err)
	}
	var denied *connectors.EgressDeniedError
	if _, err := svc.Create(ctx, httpConnector("m", "http://169.254.169.254/latest")); !errors.As(err, &denied) {
		t.Errorf("Create of a link-local URL = %v, want EgressDeniedError", err)
	}
	withHeader := httpConnector("x", "http://127.0.0.1:9/mcp")
	withHeader.Spec.HTTP.Headers = map[string]string{"Authorization": "Bearer x"}
	if _, err := svc.Create(ctx, withHeader); !errors.Is(err, secret.ErrNoKey) {
		t.Errorf("Create with a header value and no SECRET_KEY = %v, want secret.ErrNoKey", err)
	}
	for _, id := range []string{"s", "m", "x"} {
		if _, ok := lv.Lookup("ws", id); ok {
			t.Errorf("connector %s was applied though refused", id)
		}
	}
}
