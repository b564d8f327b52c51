// Package secret seals connector secrets (HTTP header values and stdio
// environment values) with AES-256-GCM under the operator's SECRET_KEY, so
// that Postgres only ever holds ciphertext.
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
}

// IsEmpty reports whether there is nothing to seal.
func (v Values) IsEmpty() bool { return len(v.Headers) == 0 && len(v.Env) == 0 }

// String names the keys only, so a stray %v never prints a secret.
func (v Values) String() string {
	return fmt.Sprintf("secret.Values{Headers: %v, Env: %v}", keys(v.Headers), keys(v.Env))
}

// GoString is String, for %#v.
func (v Values) GoString() string { return v.String() }

// LogValue is String, for slog.
func (v Values) LogValue() slog.Value { return slog.StringValue(v.String()) }

func keys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// Box seals and opens Values. A nil *Box has no key: Seal and Open of
// anything but nothing return ErrNoKey. Safe for concurrent use.
type Box struct {
	aead cipher.AEAD
}

// ParseKey builds a Box from a base64-encoded 32-byte key (standard or URL
// alphabet, padded or not). An empty key gives a nil Box and no error.
func ParseKey(encoded string) (*Box, error) {
	encoded = strings.TrimSpace(encoded)
	if encoded == "" {
		return nil, nil
	}
	var key []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if key, err = enc.DecodeString(encoded); err == nil {
			break
		}
	}
	if err != nil {
		return nil, errors.New("SECRET_KEY is not valid base64 (generate one with: openssl rand -base64 32)")
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("SECRET_KEY decodes to %d bytes, want 32 (generate one with: openssl rand -base64 32)", len(key))
	}
	return NewBox(key)
}

// NewBox builds a Box from a 32-byte key.
func NewBox(key []byte) (*Box, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return &Box{aead: aead}, nil
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
	out := make([]byte, 1, 1+b.aead.NonceSize()+len(plain)+b.aead.Overhead())
	out[0] = version
	nonce := make([]byte, b.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out = append(out, nonce...)
	return b.aead.Seal(out, nonce, plain, []byte(context)), nil
}

// Open decrypts what Seal sealed with the same context. nil opens to empty
// Values. Returns ErrNoKey without a key and ErrOpen if the value does not
// decrypt.
func (b *Box) Open(sealed []byte, context string) (Values, error) {
	if len(sealed) == 0 {
		return Values{}, nil
	}
	if b == nil {
		return Values{}, ErrNoKey
	}
	n := b.aead.NonceSize()
	if sealed[0] != version || len(sealed) < 1+n+b.aead.Overhead() {
		return Values{}, ErrOpen
	}
	plain, err := b.aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(context))
	if err != nil {
		return Values{}, ErrOpen
	}
	var v Values
	if err := json.Unmarshal(plain, &v); err != nil {
		return Values{}, ErrOpen
	}
	return v, nil
}
