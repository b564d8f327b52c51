package console

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/connector-svc/connector-svc/internal/auth"
)

// cookieName is the session cookie's name.
const cookieName = "console_session"

// cookieGrace is how long a browser keeps the cookie past the sign-in's
// end.
const cookieGrace = time.Hour

// maxFormBytes bounds a posted form.
const maxFormBytes = 1 << 20

// session is a signed-in person: the key they signed in with.
type session struct {
	token   string
	key     auth.Key
	csrf    string
	expires time.Time
}

// sealed is what the cookie holds, sealed: the token, when the sign-in
// ends, and a random id the CSRF token is derived from.
type sealed struct {
	Token   string `json:"t"`
	Expires int64  `json:"e"`
	ID      string `json:"i"`
}

// sealer seals cookies with AES-GCM and derives CSRF tokens with HMAC,
// each under its own key derived from the console's cookie key.
type sealer struct {
	aead    cipher.AEAD
	csrfKey []byte
	now     func() time.Time
}

func newSealer(key []byte) (*sealer, error) {
	if len(key) < 32 {
		return nil, errors.New("console: the cookie key must be at least 32 bytes")
	}
	block, err := aes.NewCipher(derive(key, "console cookie")[:32])
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead, csrfKey: derive(key, "console csrf"), now: time.Now}, nil
}

func derive(key []byte, purpose string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

func (s *sealer) seal(v sealed) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(cookieName))), nil
}

func (s *sealer) open(value string) (sealed, error) {
	raw, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return sealed{}, errBadCookie
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(cookieName))
	if err != nil {
		return sealed{}, errBadCookie
	}
	var v sealed
	if err := json.Unmarshal(plain, &v); err != nil {
		return sealed{}, errBadCookie
	}
	return v, nil
}

func (s *sealer) csrf(id string) string {
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Why a request has no session.
var (
	errNoCookie  = errors.New("not signed in")
	errBadCookie = errors.New("the sign-in cookie is not one this service sealed")
	errExpired   = errors.New("the sign-in has expired")
)

// session opens the request's cookie and checks its key again: a revoked
// key ends its sign-ins at once.
func (h *Handler) session(r *http.Request) (*session, error) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil, errNoCookie
	}
	v, err := h.seal.open(c.Value)
	if err != nil {
		return nil, err
	}
	exp := time.Unix(v.Expires, 0)
	if !h.seal.now().Before(exp) {
		return nil, errExpired
	}
	key, err := h.keys.Verify(r.Context(), v.Token)
	if err != nil {
		return nil, keyError(err, key)
	}
	return &session{token: v.Token, key: key, csrf: h.seal.csrf(v.ID), expires: exp}, nil
}

// keyError says why a key was refused, without its token.
func keyError(err error, key auth.Key) error {
	switch {
	case errors.Is(err, auth.ErrRevoked):
		return fmt.Errorf("API key %s is revoked", key.ID)
	case errors.Is(err, auth.ErrUnknownKey), errors.Is(err, auth.ErrNoKey):
		return errors.New("that API key is not known to this service")
	}
	return errUnavailable
}

var errUnavailable = errors.New("the service cannot check API keys now; try again in a moment")

// checkForm refuses a post without this session's CSRF token, or sent
// from another site.
func (h *Handler) checkForm(r *http.Request, s *session) error {
	if err := sameOrigin(r); err != nil {
		return err
	}
	r.Body = http.MaxBytesReader(nil, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("the form could not be read: %v", err)
	}
	if got := r.PostForm.Get("csrf"); got == "" || !hmac.Equal([]byte(got), []byte(s.csrf)) {
		return errors.New("the form's CSRF token is missing or wrong. Reload the page and send it again")
	}
	return nil
}

// sameOrigin refuses a request a browser says came from another site.
func sameOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return errors.New("the form was sent from another site")
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("the form was sent from %s, not from this console", o)
		}
	}
	return nil
}

// signedOut answers a request without a valid session: a page asked for
// goes to the sign-in page and back; anything else is refused.
func (h *Handler) signedOut(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errUnavailable) {
		h.fail(w, r, nil, http.StatusServiceUnavailable, "Try again", err.Error())
		return
	}
	clearCookie(w)
	if r.Method == http.MethodGet && r.Header.Get("Accept") != "text/event-stream" {
		q := url.Values{"next": {r.URL.RequestURI()}}
		if !errors.Is(err, errNoCookie) {
			q.Set("why", err.Error())
		}
		http.Redirect(w, r, "/signin?"+q.Encode(), http.StatusSeeOther)
		return
	}
	h.render(w, r, nil, http.StatusUnauthorized, "signin", "Sign in", signInData{Error: capitalize(err.Error()) + ". Sign in again."})
}

type signInData struct {
	Next, Error string
}

func (h *Handler) signInPage(w http.ResponseWriter, r *http.Request) {
	d := signInData{Next: safeNext(r.URL.Query().Get("next"))}
	if why := r.URL.Query().Get("why"); why != "" {
		d.Error = capitalize(why) + ". Sign in again."
	}
	h.render(w, r, nil, http.StatusOK, "signin", "Sign in", d)
}

func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := sameOrigin(r); err != nil {
		h.render(w, r, nil, http.StatusForbidden, "signin", "Sign in", signInData{Error: capitalize(err.Error()) + "."})
		return
	}
	_ = r.ParseForm()
	next := safeNext(r.PostForm.Get("next"))
	token := strings.TrimSpace(r.PostForm.Get("key"))
	if token == "" {
		h.render(w, r, nil, http.StatusUnauthorized, "signin", "Sign in", signInData{Next: next, Error: "Enter an API key."})
		return
	}
	key, err := h.keys.Verify(r.Context(), token)
	if err != nil {
		err = keyError(err, key)
		h.logger.InfoContext(r.Context(), "console sign-in refused", slog.String("error", err.Error()))
		status := http.StatusUnauthorized
		if errors.Is(err, errUnavailable) {
			status = http.StatusServiceUnavailable
		}
		h.render(w, r, nil, status, "signin", "Sign in", signInData{Next: next, Error: capitalize(err.Error()) + "."})
		return
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	exp := h.seal.now().Add(h.cfg.SessionTTL)
	value, err := h.seal.seal(sealed{Token: token, Expires: exp.Unix(), ID: base64.RawURLEncoding.EncodeToString(id)})
	if err != nil {
		h.fail(w, r, nil, http.StatusInternalServerError, "Sign-in failed", "The sign-in cookie could not be made.")
		return
	}
	// The browser keeps the cookie an hour past the sign-in's end, so that
	// the console can say the sign-in expired rather than that there is
	// none; the sealed expiry is what counts.
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: value, Path: "/", MaxAge: int((h.cfg.SessionTTL + cookieGrace) / time.Second),
		Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	h.logger.InfoContext(r.Context(), "console sign-in", slog.String("key_id", key.ID), slog.String("workspace", key.WorkspaceID))
	if next == "" {
		next = "/"
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) signOut(w http.ResponseWriter, r *http.Request, s *session) {
	clearCookie(w)
	h.logger.InfoContext(r.Context(), "console sign-out", slog.String("key_id", s.key.ID))
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

func clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1,
		Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// safeNext keeps a return path on this console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return ""
	}
	return next
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
