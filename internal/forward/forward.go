// Package forward owns the internal channel over which one replica forwards
// a call one hop to another (the owner of a stdio connector or of a
// per-session connection): the key it is authenticated with, the header
// every forwarded RPC carries, the client side that signs it and the
// server interceptors that check it.
//
// The internal listener serves the same connector.v1 ConnectorService as
// the public one, with ServerOptions' interceptors in front. A call that
// passed them carries its sender in its context (From); the public
// listener never runs them, so a caller who sends the header there gains
// nothing. A forwarded call is never forwarded again: the server checks
// Forwarded before it forwards.
//
// A forwarded call's header signs its method, its sender, the replica it
// is sent to, the time, a random nonce and the SHA-256 digest of its
// request's bytes. The receiving replica refuses a nonce it has seen
// (each keeps the nonces of the signatures still within the time window),
// a payload whose digest differs, a call signed for another replica, and
// one signed more than the skew away: a captured call can be neither
// replayed nor altered. The channel can also run over mutual TLS
// (docs/replicas.md), which keeps the payloads from being read.
package forward

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header is the metadata key of a forwarded call's signature. Its value is
// "v2.<sender replica id>.<unix millis>.<receiver>.<nonce>.<digest>.<mac>",
// the last four base64url: the internal address the call was sent to, 16
// random bytes, the SHA-256 of the request message's bytes, and
// HMAC-SHA256 over the method and all the other fields.
const Header = "x-connector-svc-forward-v2"

// LegacyHeader is the header replicas of earlier versions check: signed
// over method, sender and time only. It is still sent, so that a replica
// of this version can forward to an older one during a rolling upgrade;
// it is never accepted.
const LegacyHeader = "x-connector-svc-forward"

// label is HKDF's info: it binds the derived key to this one use.
const label = "connector-svc internal forwarding v1"

// keySize is the size of the forwarding key, SHA-256's.
const keySize = sha256.Size

// nonceSize is the size of a call's random nonce.
const nonceSize = 16

// Key derives the forwarding key from one SECRET_KEY's raw bytes (see
// secret.DecodeKeys) with HKDF-SHA256, so the raw key that seals
// connector secrets is never used for a second purpose. Replicas that
// share a SECRET_KEY derive the same key. It panics only if HKDF refuses
// the key, which a 32-byte SECRET_KEY never is.
func Key(secretKey []byte) []byte {
	k, err := hkdf.Key(sha256.New, secretKey, nil, label, keySize)
	if err != nil {
		// Only a length over 255*32 bytes fails; keySize is fixed.
		panic("forward: hkdf: " + err.Error())
	}
	return k
}

// maxReplicaID is the longest sender id a header may carry.
const maxReplicaID = 128

// checkReplicaID refuses a sender id that could not travel in the header:
// empty, too long, or with a character outside [A-Za-z0-9._:-].
func checkReplicaID(id string) error {
	if id == "" || len(id) > maxReplicaID {
		return fmt.Errorf("replica id must be 1 to %d characters, got %d", maxReplicaID, len(id))
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)
		if !ok {
			return fmt.Errorf("replica id has a character outside [A-Za-z0-9._:-] at byte %d", strings.IndexRune(id, r))
		}
	}
	return nil
}

// signed is what a header says about its call.
type signed struct {
	method, from, to string
	millis           int64
	nonce, digest    []byte
}

// mac is HMAC-SHA256(key) over s's fields, each preceded by its length so
// that no two calls sign the same bytes.
func (s signed) mac(key []byte) []byte {
	h := hmac.New(sha256.New, key)
	for _, f := range [][]byte{[]byte("v2"), []byte(s.method), []byte(s.from), []byte(s.to),
		[]byte(strconv.FormatInt(s.millis, 10)), s.nonce, s.digest} {
		h.Write([]byte(strconv.Itoa(len(f)) + ":"))
		h.Write(f)
	}
	return h.Sum(nil)
}

// header is s's Header value, signed with key.
func (s signed) header(key []byte) string {
	b64 := base64.RawURLEncoding.EncodeToString
	return "v2." + s.from + "." + strconv.FormatInt(s.millis, 10) + "." + b64([]byte(s.to)) + "." +
		b64(s.nonce) + "." + b64(s.digest) + "." + b64(s.mac(key))
}

// legacyHeader is the LegacyHeader value of a call to method from replica
// from at t: HMAC-SHA256(key, method|from|millis), for older receivers.
func legacyHeader(key []byte, method, from string, t time.Time) string {
	millis := t.UnixMilli()
	h := hmac.New(sha256.New, key)
	h.Write([]byte(method + "|" + from + "|" + strconv.FormatInt(millis, 10)))
	return "v1." + from + "." + strconv.FormatInt(millis, 10) + "." + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Why a header is refused. The messages name the problem only: never the
// header's value, the expected MAC or the key.
var (
	errMalformed = errors.New("the " + Header + " header is malformed")
	errBadMAC    = errors.New("the " + Header + " header's signature does not verify (replicas with different SECRET_KEYs?)")
	errReplayed  = errors.New("the " + Header + " header's nonce was seen before (a replayed call)")
	errPayload   = errors.New("the request does not match the digest the " + Header + " header signs (changed after signing)")
	errNotBefore = errors.New("the " + Header + " header was signed before this replica started (a replayed call)")
)

// errSkew says how far off a header's timestamp is.
type errSkew struct{ off, skew time.Duration }

func (e errSkew) Error() string {
	return fmt.Sprintf("the %s header's timestamp is %v off this replica's clock, over the allowed %v "+
		"(clocks out of sync, or a replayed call)", Header, e.off.Round(time.Millisecond), e.skew)
}

// errReceiver says a call was signed for another replica.
type errReceiver struct{ to string }

func (e errReceiver) Error() string {
	return fmt.Sprintf("the %s header was signed for the replica at %q, not this one (a replayed call, or an address that moved)", Header, e.to)
}

// maxReceiver is the longest receiver address a header may carry.
const maxReceiver = 512

// parse reads a Header value for a call to method; the MAC is returned
// apart, unchecked.
func parse(value, method string) (signed, []byte, error) {
	rest, ok := strings.CutPrefix(value, "v2.")
	if !ok {
		return signed{}, nil, errMalformed
	}
	// The sender id is what lies between the first dot and the last
	// five; checkReplicaID allows dots in it.
	var tail [5]string
	for i := len(tail) - 1; i >= 0; i-- {
		j := strings.LastIndexByte(rest, '.')
		if j < 0 {
			return signed{}, nil, errMalformed
		}
		rest, tail[i] = rest[:j], rest[j+1:]
	}
	s := signed{method: method, from: rest}
	var err error
	if s.millis, err = strconv.ParseInt(tail[0], 10, 64); err != nil || checkReplicaID(s.from) != nil {
		return signed{}, nil, errMalformed
	}
	to, err := base64.RawURLEncoding.DecodeString(tail[1])
	if err != nil || len(to) == 0 || len(to) > maxReceiver {
		return signed{}, nil, errMalformed
	}
	s.to = string(to)
	var sig []byte
	for _, f := range []struct {
		dst  *[]byte
		text string
	}{{&s.nonce, tail[2]}, {&s.digest, tail[3]}, {&sig, tail[4]}} {
		b, err := base64.RawURLEncoding.DecodeString(f.text)
		if err != nil || len(b) != sizes[f.dst == &s.nonce] {
			return signed{}, nil, errMalformed
		}
		*f.dst = b
	}
	return s, sig, nil
}

// sizes are the decoded sizes of a nonce (true) and of a digest or MAC.
var sizes = map[bool]int{true: nonceSize, false: sha256.Size}

// verify checks the Header value of a call to method received at now by
// the replica at self ("" accepts any receiver: for tests), against each
// of keys, and returns what it signs. The nonce and the digest are left
// to the caller.
func verify(keys [][]byte, value, method, self string, now time.Time, skew time.Duration) (signed, error) {
	s, sig, err := parse(value, method)
	if err != nil {
		return signed{}, err
	}
	verified := false
	for _, k := range keys {
		// Every key is tried, so the time taken does not say which matched.
		verified = hmac.Equal(sig, s.mac(k)) || verified
	}
	if !verified {
		return signed{}, errBadMAC
	}
	if self != "" && s.to != self {
		return signed{}, errReceiver{to: s.to}
	}
	if off := now.Sub(time.UnixMilli(s.millis)); off > skew || off < -skew {
		return signed{}, errSkew{off: off.Abs(), skew: skew}
	}
	return s, nil
}
