package registry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/mcptest"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/testsupport"
)

// frozenServer is a real mcp-go server (streamable HTTP) behind a proxy
// that can freeze (see mcptest.Frozen).
type frozenServer struct {
	*mcptest.Frozen
	mcp *mcpServer
}

func newFrozenServer(t *testing.T) *frozenServer {
	t.Helper()
	m := newMCPServer(t, legacyServer)
	return &frozenServer{Frozen: mcptest.NewFrozen(t, m.url()), mcp: m}
}

func (f *frozenServer) url() string { return f.URL("/mcp") }

// ready waits for connector id's first connect, which a call whose
// timeout is short may not wait out under load.
func ready(t *testing.T, reg *registry.Registry, id int64) {
	t.Helper()
	if err := reg.Ready(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
}

// frozenConfig finds a silent server only by a probe after a call: the
// health check never comes.
func frozenConfig() registry.Config {
	cfg := testConfig()
	cfg.HealthInterval = time.Hour
	cfg.ProbeTimeout = 300 * time.Millisecond
	return cfg
}

// callUntil calls echo with a context that the caller cancels itself a
// moment before its deadline, as a gRPC server's context is when the
// caller's deadline passes: the caller's cancel arrives before the
// server's copy of the deadline expires.
func callUntil(reg *registry.Registry, id int64, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	early := time.AfterFunc(d-5*time.Millisecond, cancel)
	defer early.Stop()
	_, err := reg.CallTool(ctx, id, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	return err
}

// TestCallThatTimesOutProbesTheSession: a call that ends by a deadline with
// no answer, the caller's (seen as a cancel, the way a gRPC server sees it)
// or the connector's call timeout, has the session probed at once, and a
// session that does not answer the probe is dropped, long before any
// health check.
func TestCallThatTimesOutProbesTheSession(t *testing.T) {
	for _, tt := range []struct {
		name string
		call func(*registry.Registry) error
	}{
		{"the caller's deadline", func(reg *registry.Registry) error { return callUntil(reg, 1, 300*time.Millisecond) }},
		{"the call timeout", func(reg *registry.Registry) error {
			_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFrozenServer(t)
			spec := httpSpec(1, f.url())
			spec.CallTimeout = 300 * time.Millisecond
			src := newSource(spec)
			reg := run(t, src, frozenConfig())
			ready(t, reg, 1)
			echo(t, reg, 1, "before")

			f.Freeze()
			if err := tt.call(reg); err == nil {
				t.Fatal("a call to a frozen server succeeded")
			}
			testsupport.WaitFor(t, "the probe to find the session silent", func() bool { return src.healthSaw(1, "probe got no answer") })
			if h, _ := reg.Health(1); h.State == registry.StateReady {
				t.Errorf("state after the probe = %s, want down", h.State)
			}
		})
	}
}

// TestFrozenServerFailsTheNextCallFast: once a frozen server's session is
// dropped, the reconnect hangs (its connect timeout is long); a call that
// comes meanwhile fails at once with UNAVAILABLE and what happened, instead
// of waiting its whole deadline on that reconnect. When the server thaws,
// the connector comes back by itself.
func TestFrozenServerFailsTheNextCallFast(t *testing.T) {
	f := newFrozenServer(t)
	spec := httpSpec(1, f.url())
	spec.CallTimeout, spec.ConnectTimeout = 60*time.Second, 30*time.Second // the defaults: callers' deadlines count
	src := newSource(spec)
	reg := run(t, src, frozenConfig())
	echo(t, reg, 1, "before")

	f.Freeze()
	_ = callUntil(reg, 1, 300*time.Millisecond)
	testsupport.WaitFor(t, "the probe to find the session silent", func() bool { return src.healthSaw(1, "probe got no answer") })
	testsupport.WaitFor(t, "the reconnect to reach the frozen server", func() bool { return f.Held.Load() >= 3 })

	const deadline = 5 * time.Second
	var took []time.Duration
	for range 3 {
		start := time.Now()
		err := callUntil(reg, 1, deadline)
		took = append(took, time.Since(start))
		if !errors.Is(err, registry.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a call while the reconnect hangs: %v after %s, want ErrUnavailable at once", err, took[len(took)-1])
		}
		for _, want := range []string{"connection lost", "ago", "probe got no answer", "a new attempt has been under way for"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	}
	t.Logf("calls with a %s deadline failed after %v (the reconnect was hanging)", deadline, took)

	f.Thaw()
	testsupport.WaitFor(t, "the connector to come back", func() bool {
		h, _ := reg.Health(1)
		return h.State == registry.StateReady
	})
	echo(t, reg, 1, "after")
}

// TestConnectHasADeadlineOfItsOwn: a connect to a server that takes the
// request and never answers ends at the connector's connect timeout, and
// says so; a call that started it waits no longer than that either.
func TestConnectHasADeadlineOfItsOwn(t *testing.T) {
	f := newFrozenServer(t)
	f.Freeze()
	spec := httpSpec(1, f.url())
	spec.ConnectTimeout = 300 * time.Millisecond
	src := newSource(spec)
	reg := run(t, src, frozenConfig())
	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("a call waiting for a connect that gets no answer: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "no answer within the connect timeout (300ms)") {
		t.Errorf("error %q does not say the connect timed out", err)
	}
	testsupport.WaitFor(t, "the failed connect to be recorded", func() bool {
		return src.healthSaw(1, "no answer within the connect timeout (300ms)")
	})
}

// TestDeadSessionIsNotDeleted: the session of a server that stopped
// answering is dropped without a DELETE (it would hang too); a live one,
// closed because its connector was deleted while its server froze, sends
// its DELETE, gives up on it within a second, and Delete waits for none
// of it.
func TestDeadSessionIsNotDeleted(t *testing.T) {
	f := newFrozenServer(t)
	spec := httpSpec(1, f.url())
	spec.CallTimeout = 300 * time.Millisecond
	spec.ConnectTimeout = 30 * time.Second
	src := newSource(spec, httpSpec(2, f.url()))
	reg := run(t, src, frozenConfig())
	ready(t, reg, 1)
	echo(t, reg, 1, "before")
	echo(t, reg, 2, "before")

	f.Freeze()
	_ = callUntil(reg, 1, 300*time.Millisecond)
	testsupport.WaitFor(t, "the probe to find the session silent", func() bool { return src.healthSaw(1, "probe got no answer") })

	done := make(chan struct{})
	go func() {
		reg.Delete(2)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Delete of a connector whose server froze did not return within 10s")
	}
	testsupport.WaitFor(t, "the live session's DELETE to be sent and given up", func() bool { return f.DeletesLeft.Load() == 1 })
	// The dead session was closed when the probe dropped it, a second
	// before: a DELETE it sent would have arrived first.
	if n := f.Deletes.Load(); n != 1 {
		t.Errorf("DELETEs that reached the server: %d, want 1 (the live session's only)", n)
	}
}

// TestConnectorDeletedDuringACall: a call running when its connector is
// deleted, or deactivated, ends saying so, not that the registry closed.
func TestConnectorDeletedDuringACall(t *testing.T) {
	for _, tt := range []struct {
		name   string
		remove func(*registry.Registry)
		want   error
		text   string
	}{
		{"deleted", func(r *registry.Registry) { r.Delete(1) }, registry.ErrDeleted, "the connector was deleted during the call"},
		{"deactivated", func(r *registry.Registry) { r.Remove(1) }, registry.ErrDeactivated, "the connector was deactivated during the call"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newMCPServer(t, legacyServer)
			reg := run(t, newSource(httpSpec(1, srv.url())), testConfig())
			echo(t, reg, 1, "before")
			done := make(chan error, 1)
			go func() {
				_, err := reg.CallTool(ctxT(t), 1, "block", nil, registry.CallOptions{})
				done <- err
			}()
			<-srv.blocking
			tt.remove(reg)
			err := <-done
			if !errors.Is(err, tt.want) || !errors.Is(err, registry.ErrNotLoaded) || err.Error() != tt.text {
				t.Errorf("the call under way: %v, want %q", err, tt.text)
			}
		})
	}
}

// TestDownConnectorSaysWhenItFailedAndWhatIsNext: a call to a connector
// whose server refuses connections, within the fail-fast window, gets the
// last attempt's error as such: how long ago, and when the next attempt is;
// mcp-go's doubled words said once.
func TestDownConnectorSaysWhenItFailedAndWhatIsNext(t *testing.T) {
	srv := newMCPServer(t, legacyServer)
	srv.stop()
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour
	cfg.ProbeAfter = time.Hour
	src := newSource(httpSpec(1, srv.url()))
	reg := run(t, src, cfg)
	testsupport.WaitFor(t, "the first connect to fail", func() bool { return src.healthSaw(1, "connection refused") })
	_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{})
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("call to a down connector: %v, want ErrUnavailable", err)
	}
	msg := err.Error()
	for _, want := range []string{"connector unavailable: last connect attempt ", " ago failed: ", "connection refused; next attempt in "} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "failed to send request: failed to send request") {
		t.Errorf("error %q repeats mcp-go's words", msg)
	}
	if h := src.lastHealth(1); strings.Contains(h.LastError, "failed to send request: failed to send request") {
		t.Errorf("health error %q repeats mcp-go's words", h.LastError)
	}
}

// wrongTransport is a connector pointed at a server of the other HTTP
// transport, and the hint its error must carry.
type wrongTransport struct {
	name, transport, url, hint string
}

// TestWrongHTTPTransportIsHinted: an SSE connector pointed at a
// streamable-HTTP server, and the converse, fail with a hint at the
// transport.
func TestWrongHTTPTransportIsHinted(t *testing.T) {
	streamable, sse := newMCPServer(t, legacyServer), newMCPServer(t, sseServer)
	checkHints(t, []wrongTransport{
		{"sse at streamable_http", registry.TransportSSE, streamable.url(), "is this a streamable_http server?"},
		{"streamable_http at sse", registry.TransportStreamableHTTP, sse.url(), "is this an SSE server?"},
	})
}

// The reference server answers the SSE transport's GET with a 400, where
// mcp-go's opens a stream that names no endpoint.
func TestInteropTypeScriptWrongTransportIsHinted(t *testing.T) {
	streamable, sse := startTSServer(t, "streamableHttp"), startTSServer(t, "sse")
	checkHints(t, []wrongTransport{
		{"sse at streamable_http", registry.TransportSSE, streamable.url("/mcp"), "unexpected status code: 400 — is this a streamable_http server?"},
		{"streamable_http at sse", registry.TransportStreamableHTTP, sse.url("/sse"), "is this an SSE server?"},
	})
}

func checkHints(t *testing.T, targets []wrongTransport) {
	t.Helper()
	var specs []registry.Spec
	for i, tg := range targets {
		spec := httpSpec(int64(i+1), tg.url)
		spec.Transport = tg.transport
		spec.ConnectTimeout = time.Second
		specs = append(specs, spec)
	}
	src := newSource(specs...)
	run(t, src, testConfig())
	for i, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			testsupport.WaitFor(t, "the hint", func() bool { return src.healthSaw(int64(i+1), tg.hint) })
		})
	}
}

// TestSessionStillOpeningIsNotIdle: a per_session connection whose server
// takes longer than the idle TTL to answer its handshake is in use, not
// idle: the expiry leaves it, and the call that opens it succeeds.
func TestSessionStillOpeningIsNotIdle(t *testing.T) {
	f := newFrozenServer(t)
	direct := newMCPServer(t, legacyServer)
	slow, witness := httpSpec(1, f.url()), httpSpec(2, direct.url())
	slow.SessionMode, witness.SessionMode = registry.SessionPerSession, registry.SessionPerSession
	cfg := testConfig()
	cfg.SessionIdleTTL = 200 * time.Millisecond
	reg := run(t, newSource(slow, witness), cfg)
	if _, err := reg.Catalog(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}

	f.Freeze()
	done := make(chan error, 1)
	go func() {
		_, err := reg.CallTool(ctxT(t), 1, "echo", map[string]any{"text": "x"}, registry.CallOptions{Session: "s"})
		done <- err
	}()
	testsupport.WaitFor(t, "the session's handshake to reach the frozen server", func() bool { return f.Held.Load() >= 1 })
	// A session of the other connector, opened after this one, expiring
	// shows that an expiry ran after this one's TTL passed.
	if _, err := reg.CallTool(ctxT(t), 2, "echo", map[string]any{"text": "x"}, registry.CallOptions{Session: "w"}); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, "the later idle session to expire", func() bool { return reg.SessionCount(2) == 0 })
	if n := reg.SessionCount(1); n != 1 {
		t.Errorf("sessions of the connector whose session is opening = %d, want 1", n)
	}
	f.Thaw()
	if err := <-done; err != nil {
		t.Errorf("the call whose session took longer than the idle TTL to open: %v", err)
	}
}
