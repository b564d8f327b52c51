package msglimit

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// TestMessageLimiter feeds stdio lines and SSE events, one byte per read:
// messages within the limit come through unchanged, an over-long answer
// becomes an error answer to its id (wherever the id is in it), and an
// over-long request or notification is dropped.
func TestMessageLimiter(t *testing.T) {
	big := strings.Repeat(`x\"y`, 40)
	refused := func(id string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32090,"message":"` + refusalText + ` 100 bytes"}}`
	}
	small := `{"jsonrpc":"2.0","id":9,"result":{}}`
	for _, tt := range []struct {
		name, in, want string
		events         bool
	}{
		{"small lines pass", small + "\n" + small + "\n", small + "\n" + small + "\n", false},
		{"id first", `{"jsonrpc":"2.0","id":3,"result":{"text":"` + big + `"}}` + "\n" + small + "\n",
			refused("3") + "\n" + small + "\n", false},
		{"id last, a string, after a nested id", `{"result":{"id":5,"text":"` + big + `"},"jsonrpc":"2.0","id":"a-7"}` + "\n" + small + "\n",
			refused(`"a-7"`) + "\n" + small + "\n", false},
		{"a request is dropped", `{"jsonrpc":"2.0","id":4,"method":"sampling/createMessage","params":{"t":"` + big + `"}}` + "\n" + small + "\n",
			small + "\n", false},
		{"a notification is dropped", `{"jsonrpc":"2.0","method":"notifications/message","params":{"t":"` + big + `"}}` + "\n" + small + "\n",
			small + "\n", false},
		{"the last line, unended", `{"jsonrpc":"2.0","id":12,"result":{"text":"` + big + `"}}`, refused("12") + "\n", false},
		{"events", "event: message\r\ndata: " + small + "\r\n\r\nevent: message\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":\"" + big +
			"\"}\r\n\r\n: ping\n\nevent: message\ndata: " + small + "\n\n",
			"event: message\r\ndata: " + small + "\r\n\r\nevent: message\ndata: " + refused("3") + "\n\n: ping\n\nevent: message\ndata: " + small + "\n\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := io.ReadAll(newMessageLimiter(iotest.OneByteReader(strings.NewReader(tt.in)), 100, tt.events))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestLimitBody: a body fails with ErrTooLarge past its limit, not at it.
func TestLimitBody(t *testing.T) {
	for _, n := range []int{99, 100, 101, 5000} {
		b := &limitBody{ReadCloser: io.NopCloser(strings.NewReader(strings.Repeat("x", n))), left: 100, limit: 100}
		got, err := io.ReadAll(b)
		if over := n > 100; over != errors.Is(err, ErrTooLarge) || len(got) != min(n, 100) {
			t.Errorf("a body of %d bytes: read %d, %v", n, len(got), err)
		}
	}
}

// TestMessageLimiterHandsOnEachMessageAtItsEnd writes a stream one byte at
// a time through a pipe and writes no more after a message ends until the
// reader has it: every message, the last one too, is handed on as soon as
// its end (the newline of a stdio line, the empty line after an SSE
// event, CRLF or LF) is read, not when more bytes or the end of the stream
// come.
func TestMessageLimiterHandsOnEachMessageAtItsEnd(t *testing.T) {
	small := `{"jsonrpc":"2.0","id":9,"result":{}}`
	progress := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}`
	for _, tt := range []struct {
		name     string
		messages []string
		events   bool
	}{
		{"stdio lines", []string{progress + "\n", small + "\n", small + "\r\n"}, false},
		{"events", []string{
			"event: message\ndata: " + progress + "\n\n",
			"event: message\r\nid: 7\r\ndata: " + small + "\r\n\r\n",
			": ping\n\n",
			"id: 8\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":3,\"result\":{}}\n\n",
			"event: message\ndata: " + small + "\n\n",
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			m := newMessageLimiter(pr, 1000, tt.events)
			reads := make(chan string)
			go func() {
				defer close(reads)
				p := make([]byte, 7) // messages take several reads
				for {
					n, err := m.Read(p)
					if n > 0 {
						reads <- string(p[:n])
					}
					if err != nil {
						return
					}
				}
			}()
			for i, msg := range tt.messages {
				for j := range len(msg) {
					if _, err := pw.Write([]byte{msg[j]}); err != nil {
						t.Fatal(err)
					}
				}
				var got string
				for got != msg {
					select {
					case r := <-reads:
						got += r
						if !strings.HasPrefix(msg, got) {
							t.Fatalf("message %d: read %q, want %q", i, got, msg)
						}
					case <-time.After(5 * time.Second):
						t.Fatalf("message %d was not handed on once it ended: read %q of %q", i, got, msg)
					}
				}
			}
			pw.Close()
			if r, ok := <-reads; ok {
				t.Errorf("read %q after the last message", r)
			}
		})
	}
}
