package secret_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/secret"
)

const distinctive = "sk-DISTINCTIVE-7f3a9c"

func newBox(t *testing.T, fill byte) *secret.Box {
	t.Helper()
	b, err := secret.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSealOpenRoundTrip(t *testing.T) {
	box := newBox(t, 1)
	v := secret.Values{Headers: map[string]string{"Authorization": "Bearer " + distinctive}}
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
	for _, bad := range []string{"not base64!!", base64.StdEncoding.EncodeToString(key[:16])} {
		if _, err := secret.ParseKey(bad); err == nil || !strings.Contains(err.Error(), "SECRET_KEY") {
			t.Errorf("ParseKey(%q): err = %v, want one naming SECRET_KEY", bad, err)
		}
	}
}

func TestValuesNeverFormatSecrets(t *testing.T) {
	v := secret.Values{Headers: map[string]string{"Authorization": distinctive}, Env: map[string]string{"TOKEN": distinctive}}
	for _, s := range []string{fmt.Sprint(v), fmt.Sprintf("%v %+v %#v %s", v, v, v, v), v.LogValue().String()} {
		if strings.Contains(s, distinctive) {
			t.Errorf("formatted Values contain the secret: %s", s)
		}
		if !strings.Contains(s, "Authorization") {
			t.Errorf("formatted Values %q do not name the keys", s)
		}
	}
}
