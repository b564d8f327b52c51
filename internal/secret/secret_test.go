package secret_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/secret"
)

const distinctive = "sk-DISTINCTIVE-7f3a9c"

func newBox(t *testing.T, fill ...byte) *secret.Box {
	t.Helper()
	keys := make([]string, len(fill))
	for i, f := range fill {
		keys[i] = keyOf(f)
	}
	b, err := secret.ParseKey(strings.Join(keys, ","))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func keyOf(fill byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, 32))
}

func TestSealOpenRoundTrip(t *testing.T) {
	box := newBox(t, 1)
	v := secret.Values{Headers: map[string]string{"Authorization": "Bearer " + distinctive},
		Query: []secret.Param{{Name: "key", Value: distinctive}, {Name: "team", Value: "a"}, {Name: "key", Value: "2"}}}
	sealed, err := box.Seal(v, "ws/a")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(distinctive)) {
		t.Fatal("sealed value contains the plaintext")
	}
	got, err := box.Open(sealed, "ws/a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(v, got); diff != "" {
		t.Errorf("Open(Seal(v)) (-want +got):\n%s", diff)
	}
	again, _ := box.Seal(v, "ws/a")
	if bytes.Equal(sealed, again) {
		t.Error("two seals of the same value are equal; the nonce is not random")
	}
}

func TestOpenSealedBeforeQuery(t *testing.T) {
	// Sealed by the code before Values had Query, under key 0x01…, for ws/a.
	old, _ := hex.DecodeString("016b90e7b38841d0080edb2789feba00c42c6ba3aaab123c7f4a8c9e15956d4110526edd2d2dfb9c3addca8155a49ea5052650b002c0c6abe74382a4d3bef64f9660a505f71bd1")
	got, err := newBox(t, 1).Open(old, "ws/a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(secret.Values{Headers: map[string]string{"Authorization": "Bearer old"}}, got); diff != "" {
		t.Errorf("Open(old blob) (-want +got):\n%s", diff)
	}
}

func TestOpenRejects(t *testing.T) {
	box := newBox(t, 1)
	sealed, err := box.Seal(secret.Values{Env: map[string]string{"TOKEN": distinctive}}, "ws/a")
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	tests := []struct {
		name    string
		box     *secret.Box
		sealed  []byte
		context string
		want    error
	}{
		{"other key", newBox(t, 2), sealed, "ws/a", secret.ErrOpen},
		{"other row", box, sealed, "ws/b", secret.ErrOpen},
		{"tampered", box, tampered, "ws/a", secret.ErrOpen},
		{"truncated", box, sealed[:5], "ws/a", secret.ErrOpen},
		{"no key", nil, sealed, "ws/a", secret.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.box.Open(tt.sealed, tt.context)
			if !errors.Is(err, tt.want) {
				t.Errorf("Open: err = %v, want %v", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), distinctive) {
				t.Error("error contains the secret")
			}
		})
	}
}

func TestNoKey(t *testing.T) {
	var box *secret.Box
	if sealed, err := box.Seal(secret.Values{}, "x"); sealed != nil || err != nil {
		t.Errorf("Seal(empty) without key = %v, %v; want nil, nil", sealed, err)
	}
	if _, err := box.Seal(secret.Values{Env: map[string]string{"A": "b"}}, "x"); !errors.Is(err, secret.ErrNoKey) {
		t.Errorf("Seal without key: err = %v, want ErrNoKey", err)
	}
	if v, err := box.Open(nil, "x"); err != nil || !v.IsEmpty() {
		t.Errorf("Open(nil) without key = %v, %v", v, err)
	}
}

func TestParseKey(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
		if b, err := secret.ParseKey(enc.EncodeToString(key)); err != nil || b == nil {
			t.Errorf("ParseKey(valid) = %v, %v", b, err)
		}
	}
	if b, err := secret.ParseKey(""); b != nil || err != nil {
		t.Errorf("ParseKey(\"\") = %v, %v; want nil, nil", b, err)
	}
	if b, err := secret.ParseKey(keyOf(1) + ", " + keyOf(2)); err != nil || b == nil {
		t.Errorf("ParseKey(two keys) = %v, %v", b, err)
	}
	short := base64.StdEncoding.EncodeToString(key[:16])
	for bad, want := range map[string]string{
		"not base64!!":             "SECRET_KEY is not valid base64",
		short:                      "SECRET_KEY decodes to 16 bytes",
		keyOf(1) + "," + short:     "SECRET_KEY key 2 of 2 decodes to 16 bytes",
		keyOf(1) + ",":             "SECRET_KEY key 2 of 2 is empty",
		"not base64!!," + keyOf(1): "SECRET_KEY key 1 of 2 is not valid base64",
	} {
		_, err := secret.ParseKey(bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseKey(%q): err = %v, want one saying %q", bad, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), keyOf(1)) || strings.Contains(err.Error(), short)) {
			t.Errorf("ParseKey error contains a key: %v", err)
		}
	}
}

// TestKeyRotation seals under key 1, opens under "2,1", reseals there, and
// opens the result under key 2 alone.
func TestKeyRotation(t *testing.T) {
	v := secret.Values{Headers: map[string]string{"Authorization": "Bearer " + distinctive}}
	sealed, err := newBox(t, 1).Seal(v, "ws/a")
	if err != nil {
		t.Fatal(err)
	}
	both := newBox(t, 2, 1)
	if got, err := both.Open(sealed, "ws/a"); err != nil || !cmp.Equal(v, got) {
		t.Fatalf("Open under \"2,1\" of a value sealed under 1 = %v, %v", got, err)
	}
	if _, err := newBox(t, 2).Open(sealed, "ws/a"); !errors.Is(err, secret.ErrOpen) {
		t.Fatalf("Open under 2 alone before reseal: err = %v, want ErrOpen", err)
	}
	resealed, err := both.Reseal(sealed, "ws/a")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := newBox(t, 2).Open(resealed, "ws/a"); err != nil || !cmp.Equal(v, got) {
		t.Errorf("Open under 2 alone after reseal = %v, %v", got, err)
	}
	if _, err := newBox(t, 1).Open(resealed, "ws/a"); !errors.Is(err, secret.ErrOpen) {
		t.Errorf("Open under the old key of a resealed value: err = %v, want ErrOpen", err)
	}
	if _, err := both.Reseal(sealed, "ws/b"); !errors.Is(err, secret.ErrOpen) {
		t.Errorf("Reseal for another row: err = %v, want ErrOpen", err)
	}
}

func TestValuesNeverFormatSecrets(t *testing.T) {
	v := secret.Values{Headers: map[string]string{"Authorization": distinctive}, Env: map[string]string{"TOKEN": distinctive},
		Query: []secret.Param{{Name: "api_key", Value: distinctive}}}
	for _, s := range []string{fmt.Sprint(v), fmt.Sprintf("%v %+v %#v %s", v, v, v, v), v.LogValue().String()} {
		if strings.Contains(s, distinctive) {
			t.Errorf("formatted Values contain the secret: %s", s)
		}
		if !strings.Contains(s, "Authorization") || !strings.Contains(s, "api_key") {
			t.Errorf("formatted Values %q do not name the keys", s)
		}
	}
}

// TestDecodeKeys: the raw keys of SECRET_KEY come back newest first, in
// any of the base64 forms ParseKey reads; none for an empty string.
func TestDecodeKeys(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	keys, err := secret.DecodeKeys(" " + base64.RawURLEncoding.EncodeToString(a) + " , " + base64.StdEncoding.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]byte{a, b}, keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	if keys, err := secret.DecodeKeys(""); keys != nil || err != nil {
		t.Errorf("DecodeKeys(\"\") = %v, %v", keys, err)
	}
	if _, err := secret.DecodeKeys(base64.StdEncoding.EncodeToString(a[:16])); err == nil {
		t.Error("a 16-byte key was accepted")
	}
}

func TestSealBytesRoundTripAndContext(t *testing.T) {
	b, err := secret.NewBox(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := b.SealBytes([]byte("canary-token"), "ctx-a")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("canary-token")) {
		t.Fatal("sealed bytes hold the plain text")
	}
	got, err := b.OpenBytes(sealed, "ctx-a")
	if err != nil || string(got) != "canary-token" {
		t.Fatalf("OpenBytes = %q, %v", got, err)
	}
	if _, err := b.OpenBytes(sealed, "ctx-b"); !errors.Is(err, secret.ErrOpen) {
		t.Fatalf("another context opened it: %v", err)
	}
}
