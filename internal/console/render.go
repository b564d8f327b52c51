package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/connector-svc/connector-svc/internal/auth"
)

// page is what every template gets.
type page struct {
	Title   string
	Nav     []nav
	Path    string
	Key     *auth.Key
	CSRF    string
	Flash   string
	Version string
	Data    any
}

var funcs = template.FuncMap{
	"ts": func(t *timestamppb.Timestamp) string {
		if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
			return "—"
		}
		return t.AsTime().UTC().Format("2006-01-02 15:04:05Z")
	},
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"dur": func(d *durationpb.Duration) string {
		if d == nil {
			return "—"
		}
		return d.AsDuration().Round(time.Millisecond).String()
	},
	// enum shows an enum value without its type's prefix: READY, not
	// CONNECTOR_STATE_READY.
	"enum": func(prefix string, v fmt.Stringer) string {
		return strings.TrimPrefix(v.String(), prefix)
	},
	"json": func(v any) string {
		var b []byte
		switch v := v.(type) {
		case *structpb.Struct:
			if v == nil {
				return "{}"
			}
			b, _ = json.MarshalIndent(v.AsMap(), "", "  ")
		default:
			b, _ = json.MarshalIndent(v, "", "  ")
		}
		return string(b)
	},
	"lower": strings.ToLower,
	// split cuts an action's "id|path|label|csrf".
	"split":  func(s string) []string { return strings.Split(s, "|") },
	"prefix": prefix,
}

// parsePages parses each page's template with the layout.
func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := make(map[string]*template.Template)
	for _, file := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(file, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", file)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render writes a page; s is nil on the pages of a signed-out person.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, s *session, code int, name, title string, data any) {
	p := page{Title: title, Path: r.URL.Path, Version: h.cfg.Version, Data: data, Flash: takeFlash(w, r)}
	if s != nil {
		p.Key, p.CSRF = &s.key, s.csrf
		for _, n := range navItems {
			if s.key.Allows(n.Scope) {
				p.Nav = append(p.Nav, n)
			}
		}
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		h.logger.ErrorContext(r.Context(), "console: a page failed to render", slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "the page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = buf.WriteTo(w)
}

type failData struct{ Message string }

// fail writes an error page.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, s *session, code int, title, msg string) {
	h.render(w, r, s, code, "error", capitalize(title), failData{Message: capitalize(msg)})
}

// apiFail writes the page of an API error: its message is the API's.
func (h *Handler) apiFail(w http.ResponseWriter, r *http.Request, s *session, err error) {
	st := status.Convert(err)
	h.fail(w, r, s, httpStatus(st.Code()), strings.ReplaceAll(strings.ToLower(st.Code().String()), "_", " "), apiMessage(err))
}

// apiMessage is what a person is shown of an API error.
func apiMessage(err error) string {
	st := status.Convert(err)
	return capitalize(st.Message())
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable, codes.DeadlineExceeded:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// flashCookie carries a message from a form's redirect to the page it
// lands on: in a cookie, not the URL, so that a link cannot put words on a
// console page.
const flashCookie = "console_flash"

// done redirects to path with a message the next page shows.
func done(w http.ResponseWriter, r *http.Request, path, msg string) {
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(msg)), Path: "/",
		MaxAge: 60, Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, path, http.StatusSeeOther)
}

// takeFlash returns the message done left, once.
func takeFlash(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: "/", MaxAge: -1, Secure: true, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	msg, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return ""
	}
	return string(msg)
}

// httpStatusOf is the status of a page that shows err.
func httpStatusOf(err error) int {
	if st, ok := status.FromError(err); ok {
		return httpStatus(st.Code())
	}
	return http.StatusBadRequest
}
