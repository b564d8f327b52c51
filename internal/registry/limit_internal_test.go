package registry

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
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

// TestLimitBody: a body fails with ErrResultTooLarge past its limit, not at it.
func TestLimitBody(t *testing.T) {
	for _, n := range []int{99, 100, 101, 5000} {
		b := &limitBody{ReadCloser: io.NopCloser(strings.NewReader(strings.Repeat("x", n))), left: 100, limit: 100}
		got, err := io.ReadAll(b)
		if over := n > 100; over != errors.Is(err, ErrResultTooLarge) || len(got) != min(n, 100) {
			t.Errorf("a body of %d bytes: read %d, %v", n, len(got), err)
		}
	}
}
