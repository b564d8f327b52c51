package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"strings"
)

// A token is "csk_" + the key's id + "_" + 32 random bytes in base64url:
// csk_k7f3a9c2_Zm9vYmFy…. The id is public (listings, logs, revoke); the
// random part is the secret. 256 random bits make a plain SHA-256 a safe
// way to store it: there is nothing to guess.
const (
	tokenPrefix = "csk_"
	idBytes     = 5  // 8 base32 characters
	secretBytes = 32 // 43 base64url characters
	hintLen     = 4
)

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newToken returns a fresh key id and its token.
func newToken() (id, token string) {
	idRaw := make([]byte, idBytes)
	secret := make([]byte, secretBytes)
	_, _ = rand.Read(idRaw) // crypto/rand.Read never fails
	_, _ = rand.Read(secret)
	id = strings.ToLower(idEncoding.EncodeToString(idRaw))
	return id, tokenPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(secret)
}

// tokenLen is the length of every token newToken makes.
var tokenLen = len(tokenPrefix) + idEncoding.EncodedLen(idBytes) + 1 + base64.RawURLEncoding.EncodedLen(secretBytes)

// wellFormed reports whether s could be a token, so that garbage never
// costs a database round trip.
func wellFormed(s string) bool {
	return len(s) == tokenLen && strings.HasPrefix(s, tokenPrefix)
}

// hashToken is what the store keeps of a token.
func hashToken(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

// hint is the part of a token listings show.
func hint(token string) string { return token[len(token)-hintLen:] }
