package httppool

import (
	"testing"

	"github.com/connector-svc/connector-svc/internal/egress"
)

// TestTransportsShareByOrigin: connectors of one scheme, host and port
// share a set of transports, whatever their paths and however the port is
// written; another scheme, host or port gets its own; the last release
// closes the set, and the next user of that origin gets a new one.
func TestTransportsShareByOrigin(t *testing.T) {
	ts := New(egress.New(egress.Config{}), 8, false)
	a := ts.acquire("http://mcp.example:80/mcp")
	if b := ts.acquire("http://mcp.example/other"); b != a {
		t.Error("http://mcp.example:80/mcp and http://mcp.example/other do not share transports")
	}
	for _, u := range []string{"https://mcp.example/mcp", "http://mcp.example:8080/mcp", "http://other.example/mcp"} {
		if ts.acquire(u) == a {
			t.Errorf("%s shares the transports of http://mcp.example", u)
		}
	}
	ts.release(a)
	if a.done.Load() {
		t.Fatal("the set closed while a connector still uses it")
	}
	ts.release(a)
	if !a.done.Load() {
		t.Fatal("the set stayed open after its last connector left")
	}
	if ts.acquire("http://mcp.example/mcp") == a {
		t.Error("a closed set was handed out again")
	}
	if own := New(egress.New(egress.Config{}), 8, true); own.acquire("http://x/") == own.acquire("http://x/") {
		t.Error("with own transports, two connectors share a set")
	}
}
