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

// Header is the metadata key of a forwarded call. Its value is
// "v1.<sender replica id>.<unix millis>.<base64url HMAC-SHA256(key,
// method|sender|millis)>".
const Header = "x-connector-svc-forward"

// label is HKDF's info: it binds the derived key to this one use.
const label = "connector-svc internal forwarding v1"

// keySize is the size of the forwarding key, SHA-256's.
const keySize = sha256.Size

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

// mac is HMAC-SHA256(key, method|from|millis).
func mac(key []byte, method, from string, millis int64) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(method + "|" + from + "|" + strconv.FormatInt(millis, 10)))
	return h.Sum(nil)
}

// sign is the header value of a call to method from replica from at t.
func sign(key []byte, method, from string, t time.Time) string {
	millis := t.UnixMilli()
	return "v1." + from + "." + strconv.FormatInt(millis, 10) + "." +
		base64.RawURLEncoding.EncodeToString(mac(key, method, from, millis))
}

// Why a header is refused. The messages name the problem only: never the
// header's value, the expected MAC or the key.
var (
	errMalformed = errors.New("the " + Header + " header is malformed")
	errBadMAC    = errors.New("the " + Header + " header's signature does not verify (replicas with different SECRET_KEYs?)")
)

// errSkew says how far off a header's timestamp is.
type errSkew struct{ off, skew time.Duration }

func (e errSkew) Error() string {
	return fmt.Sprintf("the %s header's timestamp is %v off this replica's clock, over the allowed %v "+
		"(clocks out of sync, or a replayed call)", Header, e.off.Round(time.Millisecond), e.skew)
}

// verify checks a header value for a call to method received at now,
// against each of keys, and returns its sender.
func verify(keys [][]byte, value, method string, now time.Time, skew time.Duration) (string, error) {
	rest, ok := strings.CutPrefix(value, "v1.")
	if !ok {
		return "", errMalformed
	}
	// The sender id is what lies between the first dot and the last two;
	// checkReplicaID allows dots in it.
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", errMalformed
	}
	rest, sig := rest[:i], rest[i+1:]
	j := strings.LastIndexByte(rest, '.')
	if j < 0 {
		return "", errMalformed
	}
	from, ms := rest[:j], rest[j+1:]
	millis, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || checkReplicaID(from) != nil {
		return "", errMalformed
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return "", errMalformed
	}
	verified := false
	for _, k := range keys {
		// Every key is tried, so the time taken does not say which matched.
		verified = hmac.Equal(got, mac(k, method, from, millis)) || verified
	}
	if !verified {
		return "", errBadMAC
	}
	if off := now.Sub(time.UnixMilli(millis)); off > skew || off < -skew {
		return "", errSkew{off: off.Abs(), skew: skew}
	}
	return from, nil
}
