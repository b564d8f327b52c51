package telemetry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/telemetry"
)

// fakeDB answers pings with err, and counts them.
type fakeDB struct {
	mu    sync.Mutex
	err   error
	pings int
}

func (f *fakeDB) Ping(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pings++
	return f.err
}

func (f *fakeDB) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeDB) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pings
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestAdminEndpoints(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "# metrics\n") })
	for _, tt := range []struct {
		name string
		cfg  telemetry.AdminConfig
		path string
		code int
	}{
		{"healthz", telemetry.AdminConfig{}, "/healthz", 200},
		{"readyz without readiness", telemetry.AdminConfig{}, "/readyz", 200},
		{"metrics", telemetry.AdminConfig{Metrics: metrics}, "/metrics", 200},
		{"metrics off", telemetry.AdminConfig{}, "/metrics", 404},
		{"pprof off", telemetry.AdminConfig{}, "/debug/pprof/", 404},
		{"pprof heap off", telemetry.AdminConfig{}, "/debug/pprof/heap", 404},
		{"pprof cmdline off", telemetry.AdminConfig{}, "/debug/pprof/cmdline", 404},
		{"pprof on", telemetry.AdminConfig{Pprof: true}, "/debug/pprof/", 200},
		{"pprof heap on", telemetry.AdminConfig{Pprof: true}, "/debug/pprof/heap?debug=1", 200},
		{"unknown", telemetry.AdminConfig{Pprof: true, Metrics: metrics}, "/nope", 404},
	} {
		if code, body := get(t, telemetry.AdminHandler(tt.cfg), tt.path); code != tt.code {
			t.Errorf("%s: GET %s = %d, want %d\n%s", tt.name, tt.path, code, tt.code, body)
		}
	}
}

func TestReadyz(t *testing.T) {
	db := &fakeDB{}
	ready := telemetry.NewReadiness(db, telemetry.ReadinessConfig{MaxAge: time.Hour}, nil)
	h := telemetry.AdminHandler(telemetry.AdminConfig{Ready: ready})
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "starting") {
		t.Errorf("before start: %d %q, want 503 saying starting", code, body)
	}
	ready.SetStarted(true)
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Errorf("started, postgres up: %d, want 200", code)
	}
	db.set(errors.New("connection refused"))
	if code, _ := get(t, h, "/readyz"); code != 200 || db.count() != 1 {
		t.Errorf("within MaxAge: %d after %d pings, want the cached 200 after 1 ping", code, db.count())
	}
	ready = telemetry.NewReadiness(db, telemetry.ReadinessConfig{MaxAge: time.Nanosecond}, nil)
	ready.SetStarted(true)
	h = telemetry.AdminHandler(telemetry.AdminConfig{Ready: ready})
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "postgres: connection refused") {
		t.Errorf("postgres down: %d %q, want 503 naming postgres", code, body)
	}
	ready.SetStarted(false)
	if code, _ := get(t, h, "/readyz"); code != 503 {
		t.Errorf("stopping: %d, want 503", code)
	}
}

func TestReadinessWatch(t *testing.T) {
	db := &fakeDB{}
	ready := telemetry.NewReadiness(db, telemetry.ReadinessConfig{Interval: 5 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan bool, 16)
	done := make(chan error, 1)
	go func() { done <- ready.Watch(ctx, func(up bool) { changes <- up }) }()
	next := func() bool {
		t.Helper()
		select {
		case up := <-changes:
			return up
		case <-time.After(10 * time.Second):
			t.Fatal("no change reported")
			return false
		}
	}
	db.set(errors.New("down"))
	if next() {
		t.Error("first change is up; want down")
	}
	db.set(nil)
	if !next() {
		t.Error("second change is down; want up")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch = %v", err)
	}
	if len(changes) != 0 {
		t.Errorf("%d changes reported without a change", len(changes))
	}
}

func TestAdminRun(t *testing.T) {
	admin, err := telemetry.ListenAdmin(telemetry.AdminConfig{Addr: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.Run(ctx) }()
	resp, err := http.Get("http://" + admin.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz = %d", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := http.Get("http://" + admin.Addr() + "/healthz"); err == nil {
		t.Error("the admin listener still answers after Run returned")
	}
	if _, err := telemetry.ListenAdmin(telemetry.AdminConfig{Addr: "256.0.0.1:1"}, nil); err == nil || !strings.Contains(err.Error(), "ADMIN_ADDR") {
		t.Errorf("a bad address: %v, want an error naming ADMIN_ADDR", err)
	}
}
