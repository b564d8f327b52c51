package mcptest

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// Frozen is a proxy in front of an MCP server's URL that can freeze: it
// keeps accepting connections and requests, and holds every one of them,
// whatever its method, until it thaws (and then passes it on) or its
// client gives up. This is what a server that hangs, or a proxy before
// one, looks like to a client.
type Frozen struct {
	http *httptest.Server
	path string

	mu     sync.Mutex
	thawed chan struct{} // nil while not frozen; closed on thaw

	// Held counts requests held while frozen; Deletes, DELETE requests
	// that arrived; DeletesLeft, DELETEs held while frozen whose client
	// gave up on them.
	Held, Deletes, DeletesLeft atomic.Int64
}

// NewFrozen serves a proxy to target, an http URL with a path, until the
// test ends.
func NewFrozen(t testing.TB, target string) *Frozen {
	t.Helper()
	f := &Frozen{}
	f.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			f.Deletes.Add(1)
		}
		if thawed := f.gate(); thawed != nil {
			f.Held.Add(1)
			select {
			case <-thawed:
			case <-r.Context().Done():
				if r.Method == http.MethodDelete {
					f.DeletesLeft.Add(1)
				}
				return
			}
		}
		proxy(w, r, target)
	}))
	t.Cleanup(func() {
		f.Thaw()
		f.http.CloseClientConnections()
		f.http.Close()
	})
	return f
}

// URL is the proxy's URL for target: the same path on the proxy's address.
func (f *Frozen) URL(path string) string { return f.http.URL + path }

func (f *Frozen) gate() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.thawed
}

// Freeze makes the proxy hold every request from now on.
func (f *Frozen) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed == nil {
		f.thawed = make(chan struct{})
	}
}

// Thaw passes the held requests on, and every later one.
func (f *Frozen) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
}

// proxy sends r on to url and copies the answer back as it comes, event
// streams included.
func proxy(w http.ResponseWriter, r *http.Request, url string) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, url, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			w.(http.Flusher).Flush()
		}
		if err != nil {
			return
		}
	}
}
