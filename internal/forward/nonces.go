package forward

import (
	"errors"
	"sync"
	"time"
)

// DefaultMaxNonces is how many nonces a receiving replica keeps at most:
// the forwarded calls it took within one validity window of a signature
// (twice the skew). At 100 bytes each that is about 100 MiB.
const DefaultMaxNonces = 1 << 20

// errTooMany refuses a call when the nonce cache is full: taking it
// without remembering its nonce would let it be replayed.
var errTooMany = errors.New("too many forwarded calls within the signature window to remember their nonces; retry")

// nonces remembers the nonces of the calls a replica took, each until its
// signature's timestamp is more than the skew old, after which the time
// check refuses the call anyway. Only calls whose MAC verified get here,
// so nobody without the key can fill it.
type nonces struct {
	max int

	mu    sync.Mutex
	seen  map[[nonceSize]byte]int64 // nonce -> unix millis after which it may be forgotten
	swept time.Time
}

func newNonces(max int) *nonces {
	if max <= 0 {
		max = DefaultMaxNonces
	}
	return &nonces{max: max, seen: map[[nonceSize]byte]int64{}}
}

// use records nonce, forgettable after until, or refuses it as seen
// (errReplayed) or as one too many (errTooMany).
func (n *nonces) use(nonce []byte, until, now time.Time) error {
	var k [nonceSize]byte
	copy(k[:], nonce)
	nowMs := now.UnixMilli()
	n.mu.Lock()
	defer n.mu.Unlock()
	if now.Sub(n.swept) >= time.Second || len(n.seen) >= n.max {
		n.swept = now
		for k, t := range n.seen {
			if t < nowMs {
				delete(n.seen, k)
			}
		}
	}
	if t, ok := n.seen[k]; ok && t >= nowMs {
		return errReplayed
	}
	if len(n.seen) >= n.max {
		return errTooMany
	}
	n.seen[k] = until.UnixMilli()
	return nil
}

// len is how many nonces are remembered.
func (n *nonces) len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.seen)
}
