// Package secret seals connector secrets (HTTP header values, URL query
// values and stdio environment values) with AES-256-GCM under the
// operator's SECRET_KEY, so that Postgres only ever holds ciphertext, and
// keeps URL query values out of what the service shows and logs.
package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
)

var (
	// ErrNoKey means secrets must be sealed or opened but no key is set.
	ErrNoKey = errors.New("SECRET_KEY is not set")
	// ErrOpen means sealed secrets did not decrypt: another key sealed them,
	// or they were altered.
	ErrOpen = errors.New("stored secrets do not decrypt with SECRET_KEY (wrong key?)")
)

// version is the first byte of every sealed value, so the format can change.
const version = 1

// Values are the secret values of one connector.
type Values struct {
	Headers map[string]string `json:"headers,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Query is the query string of an HTTP connector's URL, in order.
	// Values sealed before it existed open with none.
	Query []Param `json:"query,omitempty"`
	// ClientSecret is the OAuth client secret of the connector's
	// pre-registered client.
	ClientSecret string `json:"client_secret,omitempty"`
}

// IsEmpty reports whether there is nothing to seal.
func (v Values) IsEmpty() bool {
	return len(v.Headers) == 0 && len(v.Env) == 0 && len(v.Query) == 0 && v.ClientSecret == ""
}

// String names the keys only, so a stray %v never prints a secret.
func (v Values) String() string {
	names := make([]string, len(v.Query))
	for i, p := range v.Query {
		names[i] = p.Name
	}
	return fmt.Sprintf("secret.Values{Headers: %v, Env: %v, Query: %v, ClientSecret: %t}", keys(v.Headers), keys(v.Env), names,
		v.ClientSecret != "")
}

// GoString is String, for %#v.
func (v Values) GoString() string { return v.String() }

// LogValue is String, for slog.
func (v Values) LogValue() slog.Value { return slog.StringValue(v.String()) }

func keys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// Box seals and opens Values. A nil *Box has no key: Seal and Open of
// anything but nothing return ErrNoKey. A Box may hold several keys, for
// rotation: the first seals, and each opens. Safe for concurrent use.
type Box struct {
	aeads []cipher.AEAD
}

// keyHint is how to make a key, for error messages.
const keyHint = "generate one with: openssl rand -base64 32"

// ParseKey builds a Box from SECRET_KEY: one base64-encoded 32-byte key
// (standard or URL alphabet, padded or not), or several separated by
// commas, the newest first. The first seals; all open. An empty string
// gives a nil Box and no error. Errors never contain the key.
func ParseKey(encoded string) (*Box, error) {
	keys, err := DecodeKeys(encoded)
	if keys == nil || err != nil {
		return nil, err
	}
	return NewBox(keys...)
}

// DecodeKeys returns the raw bytes of each key of SECRET_KEY, the newest
// first, as ParseKey reads them; none and no error for an empty string.
// For deriving keys of other purposes (forward.Key), never for using a
// raw key twice. Errors never contain a key.
func DecodeKeys(encoded string) ([][]byte, error) {
	encoded = strings.TrimSpace(encoded)
	if encoded == "" {
		return nil, nil
	}
	parts := strings.Split(encoded, ",")
	keys := make([][]byte, len(parts))
	for i, part := range parts {
		name := "SECRET_KEY"
		if len(parts) > 1 {
			name = fmt.Sprintf("SECRET_KEY key %d of %d", i+1, len(parts))
		}
		key, err := decodeKey(strings.TrimSpace(part), name)
		if err != nil {
			return nil, err
		}
		keys[i] = key
	}
	return keys, nil
}

// decodeKey reads one base64-encoded 32-byte key; name says which.
func decodeKey(encoded, name string) ([]byte, error) {
	if encoded == "" {
		return nil, fmt.Errorf("%s is empty (%s)", name, keyHint)
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		key, err := enc.DecodeString(encoded)
		if err != nil {
			continue
		}
		if len(key) != 32 {
			return nil, fmt.Errorf("%s decodes to %d bytes, want 32 (%s)", name, len(key), keyHint)
		}
		return key, nil
	}
	return nil, fmt.Errorf("%s is not valid base64 (%s)", name, keyHint)
}

// NewBox builds a Box from one or more 32-byte keys: the first seals, and
// each opens.
func NewBox(keys ...[]byte) (*Box, error) {
	if len(keys) == 0 {
		return nil, errors.New("secret key: none given")
	}
	b := &Box{aeads: make([]cipher.AEAD, len(keys))}
	for i, key := range keys {
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("secret key: %w", err)
		}
		if b.aeads[i], err = cipher.NewGCM(block); err != nil {
			return nil, fmt.Errorf("secret key: %w", err)
		}
	}
	return b, nil
}

// Seal encrypts v bound to context (such as the connector's identity), so a
// sealed value copied to another row does not open there. Empty Values seal
// to nil.
func (b *Box) Seal(v Values, context string) ([]byte, error) {
	if v.IsEmpty() {
		return nil, nil
	}
	if b == nil {
		return nil, ErrNoKey
	}
	plain, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return b.SealBytes(plain, context)
}

// Open decrypts what Seal sealed with the same context, under any of the
// Box's keys. nil opens to empty Values. Returns ErrNoKey without a key and
// ErrOpen if the value does not decrypt.
func (b *Box) Open(sealed []byte, context string) (Values, error) {
	if len(sealed) == 0 {
		return Values{}, nil
	}
	if b == nil {
		return Values{}, ErrNoKey
	}
	for _, aead := range b.aeads {
		if v, ok := open(aead, sealed, context); ok {
			return v, nil
		}
	}
	return Values{}, ErrOpen
}

func open(aead cipher.AEAD, sealed []byte, context string) (Values, bool) {
	n := aead.NonceSize()
	if sealed[0] != version || len(sealed) < 1+n+aead.Overhead() {
		return Values{}, false
	}
	plain, err := aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(context))
	if err != nil {
		return Values{}, false
	}
	var v Values
	if err := json.Unmarshal(plain, &v); err != nil {
		return Values{}, false
	}
	return v, true
}

// Reseal opens sealed under any of the Box's keys and seals it again under
// the first, for the same context. Errors are Open's and Seal's.
func (b *Box) Reseal(sealed []byte, context string) ([]byte, error) {
	v, err := b.Open(sealed, context)
	if err != nil {
		return nil, err
	}
	return b.Seal(v, context)
}

// SealBytes encrypts plain bound to context, like Seal, for secrets that
// are not a connector's Values (OAuth tokens, PKCE verifiers). Empty plain
// seals to nil.
func (b *Box) SealBytes(plain []byte, context string) ([]byte, error) {
	if len(plain) == 0 {
		return nil, nil
	}
	if b == nil {
		return nil, ErrNoKey
	}
	aead := b.aeads[0]
	out := make([]byte, 1, 1+aead.NonceSize()+len(plain)+aead.Overhead())
	out[0] = version
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out = append(out, nonce...)
	return aead.Seal(out, nonce, plain, []byte(context)), nil
}

// OpenBytes decrypts what SealBytes sealed with the same context, under
// any of the Box's keys. nil opens to nil. Returns ErrNoKey without a key
// and ErrOpen if the value does not decrypt.
func (b *Box) OpenBytes(sealed []byte, context string) ([]byte, error) {
	if len(sealed) == 0 {
		return nil, nil
	}
	if b == nil {
		return nil, ErrNoKey
	}
	for _, aead := range b.aeads {
		n := aead.NonceSize()
		if sealed[0] != version || len(sealed) < 1+n+aead.Overhead() {
			continue
		}
		if plain, err := aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(context)); err == nil {
			return plain, nil
		}
	}
	return nil, ErrOpen
}
