package console

import (
	"net/http"
	"net/url"
	"strings"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
)

type sessionsData struct {
	Connector  string
	Connectors []string
	Sessions   []*connectorv1.Session
}

// sessionsPage lists one connector's open sessions; an admin key picks
// the connector from a list, others type its id.
func (h *Handler) sessionsPage(w http.ResponseWriter, r *http.Request, s *session) {
	d := sessionsData{Connector: strings.TrimSpace(r.URL.Query().Get("connector"))}
	if s.key.Allows(auth.ScopeAdmin) {
		if cs, err := h.listAll(r.Context(), s); err == nil {
			for _, c := range cs {
				d.Connectors = append(d.Connectors, c.GetConnectorId())
			}
		}
	}
	if d.Connector != "" {
		var err error
		d.Sessions, err = all(func(token string) ([]*connectorv1.Session, string, error) {
			resp, err := h.api.ListSessions(outgoing(r.Context(), s), &connectorv1.ListSessionsRequest{WorkspaceId: s.key.WorkspaceID,
				ConnectorId: d.Connector, PageSize: 1000, PageToken: token})
			return resp.GetSessions(), resp.GetNextPageToken(), err
		})
		if err != nil {
			h.apiFail(w, r, s, err)
			return
		}
	}
	h.render(w, r, s, http.StatusOK, "sessions", "Sessions", d)
}

func (h *Handler) closeSession(w http.ResponseWriter, r *http.Request, s *session) {
	c, sid := r.PostForm.Get("connector"), r.PostForm.Get("session")
	resp, err := h.api.CloseSession(outgoing(r.Context(), s), &connectorv1.CloseSessionRequest{WorkspaceId: s.key.WorkspaceID,
		ConnectorId: c, SessionId: sid})
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	msg := "Session " + sid + " was not open."
	if resp.GetClosed() > 0 {
		msg = "Closed session " + sid + "."
	}
	done(w, r, "/sessions?connector="+url.QueryEscape(c), msg)
}

type authorizationsData struct {
	Connector, User string
	Authorizations  []*connectorv1.Authorization
	Next            string
}

func (h *Handler) authorizationsPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := authorizationsData{Connector: strings.TrimSpace(q.Get("connector")), User: strings.TrimSpace(q.Get("user"))}
	resp, err := h.api.ListAuthorizations(outgoing(r.Context(), s), &connectorv1.ListAuthorizationsRequest{WorkspaceId: s.key.WorkspaceID,
		ConnectorId: d.Connector, UserId: d.User, PageSize: 100, PageToken: q.Get("page")})
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	d.Authorizations, d.Next = resp.GetAuthorizations(), resp.GetNextPageToken()
	h.render(w, r, s, http.StatusOK, "authorizations", "Authorizations", d)
}

func (h *Handler) revokeAuthorization(w http.ResponseWriter, r *http.Request, s *session) {
	c, u := r.PostForm.Get("connector"), r.PostForm.Get("user")
	resp, err := h.api.RevokeAuthorization(outgoing(r.Context(), s), &connectorv1.RevokeAuthorizationRequest{WorkspaceId: s.key.WorkspaceID,
		ConnectorId: c, UserId: u})
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	msg := "Revoked the authorization of " + u + " on " + c + "."
	if !resp.GetRevokedAtServer() {
		msg += " The authorization server was not told (it has no revocation endpoint, or did not answer); the tokens are forgotten here."
	}
	done(w, r, "/authorizations", msg)
}

type keysData struct {
	Keys   []*connectorv1.ApiKey
	Scopes []string
	// Created is a key just made: its token is shown this once.
	Created *connectorv1.ApiKey
	Token   string
	Error   string
}

var keyScopes = []string{"admin", "query", "call", "users"}

func (h *Handler) keysPage(w http.ResponseWriter, r *http.Request, s *session) {
	h.showKeys(w, r, s, keysData{})
}

func (h *Handler) showKeys(w http.ResponseWriter, r *http.Request, s *session, d keysData) {
	d.Scopes = keyScopes
	var err error
	d.Keys, err = all(func(token string) ([]*connectorv1.ApiKey, string, error) {
		resp, err := h.api.ListApiKeys(outgoing(r.Context(), s), &connectorv1.ListApiKeysRequest{WorkspaceId: s.key.WorkspaceID,
			PageSize: 1000, PageToken: token})
		return resp.GetApiKeys(), resp.GetNextPageToken(), err
	})
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	code := http.StatusOK
	if d.Error != "" {
		code = http.StatusBadRequest
	}
	h.render(w, r, s, code, "keys", "API keys", d)
}

// createKey makes a key and shows its token once, on the page that
// answers the post (never in a URL).
func (h *Handler) createKey(w http.ResponseWriter, r *http.Request, s *session) {
	req := &connectorv1.CreateApiKeyRequest{WorkspaceId: s.key.WorkspaceID, Name: strings.TrimSpace(r.PostForm.Get("name"))}
	for _, name := range r.PostForm["scope"] {
		v, ok := connectorv1.ApiKeyScope_value["API_KEY_SCOPE_"+strings.ToUpper(name)]
		if !ok {
			h.showKeys(w, r, s, keysData{Error: "Unknown scope " + name + "."})
			return
		}
		req.Scopes = append(req.Scopes, connectorv1.ApiKeyScope(v))
	}
	resp, err := h.api.CreateApiKey(outgoing(r.Context(), s), req)
	if err != nil {
		h.showKeys(w, r, s, keysData{Error: apiMessage(err)})
		return
	}
	h.showKeys(w, r, s, keysData{Created: resp.GetApiKey(), Token: resp.GetToken()})
}

func (h *Handler) revokeKey(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if _, err := h.api.RevokeApiKey(outgoing(r.Context(), s), &connectorv1.RevokeApiKeyRequest{WorkspaceId: s.key.WorkspaceID, KeyId: id}); err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	msg := "Revoked API key " + id + "."
	if id == s.key.ID {
		msg += " It was the key you signed in with."
	}
	done(w, r, "/keys", msg)
}
