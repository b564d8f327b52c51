// Package msglimit limits what a connector's server sends: a message over
// the limit is refused as it is read, never held whole. An HTTP body that is one JSON
// message fails its read once over the limit; an SSE stream (the answer to
// a POST, or an SSE connector's long-lived stream) and a stdio server's
// stdout carry many messages, so there the limit is per message: the rest
// of an over-long one is read and discarded, and the message is replaced by
// an error answer to the same request, so that only that call fails. It
// knows nothing of connectors: callers give it a reader and a limit.
package msglimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ErrTooLarge means the server's answer was over the limit and was
// refused unread (registry.ErrResultTooLarge is this error).
var ErrTooLarge = errors.New("the server's answer is over the size limit")

// ForResult is the most bytes one message from a server may take on the
// wire when results may carry maxResult bytes of content: JSON escaping, the
// structured copy of a text result and base64 make a message larger than
// its content, so it is twice that plus a margin for the rest.
func ForResult(maxResult int) int { return 2*maxResult + 1<<20 }

// refusalText starts the message of the error answer that replaces an
// over-long message. mcp-go turns an error answer into an error carrying
// only its message, so the text is how the call path knows it (see
// AsTooLarge).
const refusalText = "connector-svc refused the server's answer: over the size limit of"

// refusalCode is the JSON-RPC code of that answer, one of the codes the
// spec leaves to implementations and mcp-go gives no meaning.
const refusalCode = -32090

// AsTooLarge returns err as ErrTooLarge when a limit refused the
// answer: a body read that failed with it, or the error answer a message
// limiter put in place of an over-long message.
func AsTooLarge(err error) error {
	if err == nil || errors.Is(err, ErrTooLarge) {
		return err
	}
	if msg := err.Error(); strings.HasPrefix(msg, refusalText) {
		return fmt.Errorf("%w:%s", ErrTooLarge, strings.TrimPrefix(msg, refusalText))
	}
	return err
}

// NewBody returns body, one JSON message, failing its read with
// ErrTooLarge once more than limit bytes have come.
func NewBody(body io.ReadCloser, limit int) io.ReadCloser {
	return &limitBody{ReadCloser: body, left: int64(limit), limit: limit}
}

// limitBody fails its read with ErrTooLarge once more than limit
// bytes have come.
type limitBody struct {
	io.ReadCloser
	left  int64
	limit int
}

func (b *limitBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.err()
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n + int(b.left), b.err()
	}
	return n, err
}

func (b *limitBody) err() error {
	return fmt.Errorf("%w: over %d bytes", ErrTooLarge, b.limit)
}

// messageLimiter hands on the messages of r whole, each once it has ended:
// a line (stdio) or an event, ended by an empty line (SSE). A message over
// limit bytes is not kept: the rest of it is read and discarded, and an
// error answer to the same request id takes its place (nothing, if it
// was not an answer). It holds at most one message of up to limit bytes.
type messageLimiter struct {
	r      io.Reader
	limit  int
	events bool

	buf     []byte // what was read last
	msg     []byte // the message so far, unless over
	content int    // bytes of the current line so far, line ends left out
	over    bool
	scan    idScanner
	ready   []byte // what Read hands out next
	off     int    // of ready, handed out already
	readErr error
}

// NewMessages returns a messageLimiter of r's messages: events (SSE) if
// events, else lines (stdio).
func NewMessages(r io.Reader, limit int, events bool) io.ReadCloser {
	return newMessageLimiter(r, limit, events)
}

func newMessageLimiter(r io.Reader, limit int, events bool) *messageLimiter {
	return &messageLimiter{r: r, limit: limit, events: events}
}

// keepCap is the buffer size kept between messages; a larger buffer, left
// by a large message, is let go.
const keepCap = 64 << 10

func (m *messageLimiter) Read(p []byte) (int, error) {
	for m.off == len(m.ready) {
		if cap(m.ready) > keepCap {
			m.ready = nil
		}
		m.ready, m.off = m.ready[:0], 0
		if m.readErr != nil {
			return 0, m.readErr
		}
		if m.buf == nil {
			m.buf = make([]byte, 32<<10)
		}
		n, err := m.r.Read(m.buf)
		m.feed(m.buf[:n])
		if err != nil {
			m.end()
			m.readErr = err
		}
	}
	n := copy(p, m.ready[m.off:])
	m.off += n
	return n, nil
}

// Close closes r if it is a Closer: an HTTP body.
func (m *messageLimiter) Close() error {
	if c, ok := m.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (m *messageLimiter) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		seg := b
		if i >= 0 {
			seg = b[:i+1]
		}
		b = b[len(seg):]
		m.take(seg)
		m.content += len(bytes.TrimRight(seg, "\r\n"))
		if i < 0 {
			continue
		}
		blank := m.content == 0
		m.content = 0
		if !m.events || blank {
			m.finish()
		}
	}
}

// take adds seg to the message, or scans it once the message is over.
func (m *messageLimiter) take(seg []byte) {
	if m.over {
		m.scan.feed(seg)
		return
	}
	m.msg = append(m.msg, seg...)
	if len(m.msg) > m.limit {
		m.over = true
		m.scan.feed(m.msg)
		m.msg = nil
	}
}

// finish hands on the message that just ended, or its refusal.
func (m *messageLimiter) finish() {
	if m.over {
		m.ready = append(m.ready, m.refusal()...)
		m.over, m.scan = false, idScanner{}
		return
	}
	m.ready = append(m.ready, m.msg...)
	if cap(m.msg) > keepCap {
		m.msg = nil
	}
	m.msg = m.msg[:0]
}

// end hands on what is left when r ends.
func (m *messageLimiter) end() {
	if m.over || len(m.msg) > 0 {
		m.finish()
	}
}

// refusal is the error answer that replaces an over-long message, with its
// end of line or event; nothing if the message was no answer.
func (m *messageLimiter) refusal() []byte {
	id, ok := m.scan.answerID()
	if !ok {
		return nil
	}
	msg, _ := json.Marshal(fmt.Sprintf("%s %d bytes", refusalText, m.limit))
	data := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}`, id, refusalCode, msg)
	if m.events {
		return []byte("event: message\ndata: " + data + "\n\n")
	}
	return []byte(data + "\n")
}

// idScanner reads a JSON object as it streams past and notes the value of
// its top-level "id" and whether it has a top-level "method" (then it is a
// request or notification, not an answer). Bytes before the object (an SSE
// event's field names) are skipped; so are SSE field names between lines
// of a multi-line data field, which fall between JSON tokens.
type idScanner struct {
	depth     int
	inString  bool
	escaped   bool
	isKey     bool   // the string being read is a top-level key
	key       []byte // that key, its first bytes
	lastKey   string // the top-level key whose value comes next
	expectKey bool
	valueOf   string // the top-level key whose value is being read
	capturing bool   // the value of "id" is being read
	id        []byte
	idDone    bool
	method    bool
}

// maxIDBytes bounds the request id kept; mcp-go's ids are short.
const maxIDBytes = 128

func (s *idScanner) feed(b []byte) {
	for len(b) > 0 {
		if s.inString && !s.escaped && !s.isKey && !s.capturing {
			// The bulk of a large message is the inside of a string:
			// skip to where it may end.
			i := indexEither(b, '"', '\\')
			if i < 0 {
				return
			}
			b = b[i:]
		}
		s.byte(b[0])
		b = b[1:]
	}
}

// indexEither is the index of the first a or b in p, or -1.
func indexEither(p []byte, a, b byte) int {
	i, j := bytes.IndexByte(p, a), bytes.IndexByte(p, b)
	if i < 0 || (j >= 0 && j < i) {
		return j
	}
	return i
}

func (s *idScanner) byte(c byte) {
	if s.inString {
		if s.capturing {
			s.keep(c)
		}
		switch {
		case s.escaped:
			s.escaped = false
		case c == '\\':
			s.escaped = true
		case c == '"':
			s.inString = false
			if s.isKey {
				s.isKey, s.lastKey = false, string(s.key)
			}
			if s.capturing {
				s.capturing, s.idDone = false, true
			}
		case s.isKey && len(s.key) < 8:
			s.key = append(s.key, c)
		}
		return
	}
	if s.capturing { // a number
		if c == ',' || c == '}' || c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			s.capturing, s.idDone = false, true
		} else {
			s.keep(c)
			return
		}
	}
	switch c {
	case '"':
		s.inString = true
		switch {
		case s.depth == 1 && s.expectKey:
			s.isKey, s.key, s.expectKey = true, s.key[:0], false
		case s.depth == 1 && s.valueOf == "id":
			s.capturing, s.id = true, append(s.id[:0], c)
		}
		s.valueOf = ""
	case ':':
		if s.depth == 1 {
			s.valueOf, s.lastKey = s.lastKey, ""
			if s.valueOf == "method" {
				s.method = true
			}
		}
	case '{', '[':
		s.depth++
		s.expectKey = s.depth == 1 && c == '{'
		s.valueOf = ""
	case '}', ']':
		s.depth--
	case ',':
		s.expectKey = s.depth == 1
	case ' ', '\t', '\r', '\n':
	default:
		if s.depth == 1 && s.valueOf == "id" {
			s.capturing, s.id = true, append(s.id[:0], c)
		}
		s.valueOf = ""
	}
}

func (s *idScanner) keep(c byte) {
	if len(s.id) < maxIDBytes {
		s.id = append(s.id, c)
	}
}

// answerID is the id of the message scanned, as JSON, if it was an answer
// (it had an id and no method).
func (s *idScanner) answerID() (string, bool) {
	if (!s.idDone && !s.capturing) || s.method || len(s.id) == 0 || !json.Valid(s.id) {
		return "", false
	}
	return string(s.id), true
}
