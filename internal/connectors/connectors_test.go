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

func httpConnector(id, url string) *store.Connector {
	return &store.Connector{WorkspaceID: "ws", ExternalID: id, Name: id, Transport: store.TransportStreamableHTTP, Active: true,
		Config: store.Config{URL: url, CallTimeout: store.Duration(10 * time.Second)}}
}

// Every change is written and then applied: the live copy follows at
// once, without a change notification.
func TestChangesAreAppliedAtOnce(t *testing.T) {
	svc, lv, reg := setup(t)
	ctx := context.Background()
	c, err := svc.Create(ctx, httpConnector("a", "http://127.0.0.1:9/mcp"), secret.Values{})
	if err != nil {
		t.Fatal(err)
	}
	if row, ok := lv.Lookup("ws", "a"); !ok || row.ID != c.ID || !reg.Has(c.ID) {
		t.Fatalf("after Create: live row %v (%v), registry holds it: %v", row, ok, reg.Has(c.ID))
	}
	updated, err := svc.Update(ctx, connectors.Update{WorkspaceID: "ws", ConnectorID: "a", Paths: []string{"name"},
		Change: func(stored *store.Connector) error { stored.Name = "renamed"; return nil }})
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
	stdio := &store.Connector{WorkspaceID: "ws", ExternalID: "s", Name: "s", Transport: store.TransportStdio, Active: true,
		Config: store.Config{Command: "bash", CallTimeout: store.Duration(time.Second)}}
	var notAllowed *connectors.CommandNotAllowedError
	if _, err := svc.Create(ctx, stdio, secret.Values{}); !errors.As(err, &notAllowed) || notAllowed.Command != "bash" {
		t.Errorf("Create of a stdio connector running bash = %v, want CommandNotAllowedError", err)
	}
	var denied *connectors.EgressDeniedError
	if _, err := svc.Create(ctx, httpConnector("m", "http://169.254.169.254/latest"), secret.Values{}); !errors.As(err, &denied) {
		t.Errorf("Create of a link-local URL = %v, want EgressDeniedError", err)
	}
	if _, err := svc.Create(ctx, httpConnector("x", "http://127.0.0.1:9/mcp"), secret.Values{Headers: map[string]string{"Authorization": "Bearer x"}}); !errors.Is(err, secret.ErrNoKey) {
		t.Errorf("Create with a header value and no SECRET_KEY = %v, want secret.ErrNoKey", err)
	}
	for _, id := range []string{"s", "m", "x"} {
		if _, ok := lv.Lookup("ws", id); ok {
			t.Errorf("connector %s was applied though refused", id)
		}
	}
}
