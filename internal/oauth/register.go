package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"

	"github.com/connector-svc/connector-svc/internal/store"
)

// clientFor returns the client the service is at issuer for connector c:
// the connector's pre-registered client; else the service's client ID
// metadata document, where the server supports those and one is
// configured; else the service's dynamic registration with the server,
// made now if there is none yet (once per issuer, whatever the replicas).
func (m *Manager) clientFor(ctx context.Context, c Connector, s *serverMetadata, insecure bool) (*client, error) {
	if c.ClientID != "" {
		return preRegistered(c, s), nil
	}
	if s.ClientIDMetadataDocumentSupported && m.cfg.ClientMetadataURL != "" {
		return &client{ID: m.cfg.ClientMetadataURL, AuthMethod: authNone}, nil
	}
	if cl, err := m.storedClient(ctx, s.Issuer); err == nil {
		return cl, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if s.RegistrationEndpoint == "" {
		reason := fmt.Sprintf("the authorization server %s offers no dynamic client registration (no registration_endpoint)", s.Issuer)
		switch {
		case s.ClientIDMetadataDocumentSupported:
			reason += " and OAUTH_CLIENT_METADATA_URL is not set for its client ID metadata documents"
		default:
			reason += " nor client ID metadata documents"
		}
		return nil, &DiscoveryError{Reason: reason + "; give the connector a pre-registered client (auth.client_id)"}
	}
	v, err := m.shared(ctx, "register\x00"+s.Issuer, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*requestTimeout)
		defer cancel()
		return m.register(ctx, s, insecure)
	})
	if err != nil {
		return nil, err
	}
	return v.(*client), nil
}

// preRegistered is c's own client; with a secret, it authenticates as the
// server prefers: client_secret_basic unless it lists only
// client_secret_post (RFC 8414: basic when it lists none).
func preRegistered(c Connector, s *serverMetadata) *client {
	cl := &client{ID: c.ClientID, Secret: c.ClientSecret, AuthMethod: authNone}
	if c.ClientSecret != "" {
		cl.AuthMethod = authBasic
		if methods := s.TokenEndpointAuthMethodsSupported; len(methods) > 0 &&
			!slices.Contains(methods, authBasic) && slices.Contains(methods, authPost) {
			cl.AuthMethod = authPost
		}
	}
	return cl
}

// clientByID returns the client with id that tokens of c at issuer were
// issued to: the connector's, the metadata document's or the stored
// registration. An error means it is no longer known (the connector's
// client changed, the registration was lost): the tokens cannot be
// refreshed or revoked.
func (m *Manager) clientByID(ctx context.Context, c Connector, issuer, id string, s *serverMetadata) (*client, error) {
	switch {
	case id == "":
	case id == c.ClientID:
		return preRegistered(c, s), nil
	case id == m.cfg.ClientMetadataURL:
		return &client{ID: id, AuthMethod: authNone}, nil
	default:
		cl, err := m.storedClient(ctx, issuer)
		if err == nil && cl.ID == id {
			return cl, nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("the client %q the tokens were issued to is no longer this connector's client at %s", id, issuer)
}

// storedClient returns the service's dynamic registration at issuer for
// its redirect URL, or store.ErrNotFound.
func (m *Manager) storedClient(ctx context.Context, issuer string) (*client, error) {
	sc, err := m.db.OAuthClient(ctx, issuer, m.cfg.RedirectURL)
	if err != nil {
		return nil, err
	}
	secret, err := m.box.OpenBytes(sc.SealedSecret, clientSecretContext(issuer, m.cfg.RedirectURL))
	if err != nil {
		return nil, fmt.Errorf("the client secret of the registration at %s: %w", issuer, err)
	}
	return &client{ID: sc.ClientID, Secret: string(secret), AuthMethod: sc.AuthMethod}, nil
}

// clientRefused handles a token or revocation endpoint's refusal of the
// client itself (invalid_client, unauthorized_client) at issuer. If cl is
// the service's dynamic registration there, the server no longer knows it
// (it restarted, or dropped it): the registration is deleted, unless
// another replica has replaced it meanwhile, and what was found of the
// server is dropped, so the next authorization registers again. For the
// client metadata document only the latter. A pre-registered client is
// left as it is: it is the operator's to fix, and the error says so.
func (m *Manager) clientRefused(ctx context.Context, issuer string, cl *client, err error) {
	var ase *AuthServerError
	if !errors.As(err, &ase) || (ase.Code != "invalid_client" && ase.Code != "unauthorized_client") {
		return
	}
	if cl.ID != m.cfg.ClientMetadataURL || cl.ID == "" {
		deleted, derr := m.db.DeleteOAuthClient(context.WithoutCancel(ctx), issuer, m.cfg.RedirectURL, cl.ID)
		if derr != nil {
			m.log.WarnContext(ctx, "could not delete a registration the authorization server refuses", slog.String("issuer", issuer),
				slog.String("client_id", cl.ID), slog.Any("error", derr))
			return
		}
		if !deleted {
			return // pre-registered, or registered again meanwhile
		}
		m.log.WarnContext(ctx, "the authorization server no longer knows the service's registration; deleted it, the next authorization registers again",
			slog.String("issuer", issuer), slog.String("client_id", cl.ID), slog.String("error", ase.Code))
	}
	m.forgetServer(issuer)
}

// ForgetRegistration deletes the service's dynamic registrations at the
// authorization server issuer (exactly as its metadata names itself) and
// drops what this process found of that server, so that the next
// authorization registers again: for a server that forgot the
// registration before any token request could tell. Users whose tokens
// were issued to the old registration must authorize again once their
// access tokens expire (their refresh tokens were the old client's).
// Returns how many registrations were deleted (0 if there were none).
func (m *Manager) ForgetRegistration(ctx context.Context, issuer string) (int, error) {
	n, err := m.db.DeleteOAuthClients(ctx, issuer)
	if err != nil {
		return 0, err
	}
	m.forgetServer(issuer)
	m.log.InfoContext(ctx, "forgot the service's registration with an authorization server", slog.String("issuer", issuer),
		slog.Int64("registrations", n))
	return int(n), nil
}

// registration is an RFC 7591 client registration response.
type registration struct {
	ClientID                string `json:"client_id"`
	ClientSecret            string `json:"client_secret"`
	TokenEndpointAuthMethod string `json:"token_endpoint_auth_method"`
}

// register registers the service with the server (RFC 7591) and stores the
// registration, unless another replica stored one first: then that one is
// used and this one is dropped.
func (m *Manager) register(ctx context.Context, s *serverMetadata, insecure bool) (*client, error) {
	if _, err := m.checkURL(ctx, "the registration endpoint", s.RegistrationEndpoint, insecure); err != nil {
		return nil, &DiscoveryError{Reason: "cannot register with " + s.Issuer + ": " + err.Error(), Err: err}
	}
	doc, _ := json.Marshal(map[string]any{
		"redirect_uris":              []string{m.cfg.RedirectURL},
		"client_name":                m.cfg.ClientName,
		"grant_types":                []string{grantCode, grantRenew},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": authNone,
		"application_type":           "web",
	})
	ctx2, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx2, http.MethodPost, s.RegistrationEndpoint, bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("register with %s: %w", s.Issuer, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := m.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("register with %s at %s: %w", s.Issuer, s.RegistrationEndpoint, fetchErr(err))
	}
	defer drain(resp)
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("register with %s: %w", s.Issuer, fetchErr(err))
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		var e errorResponse
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			ase := newAuthServerError(e.Error, e.ErrorDescription, resp.StatusCode)
			return nil, &DiscoveryError{Reason: fmt.Sprintf("dynamic client registration at %s: %v", s.RegistrationEndpoint, ase), Err: ase}
		}
		if resp.StatusCode >= 500 {
			return nil, fmt.Errorf("dynamic client registration at %s answered HTTP %d", s.RegistrationEndpoint, resp.StatusCode)
		}
		return nil, &DiscoveryError{Reason: fmt.Sprintf("dynamic client registration at %s answered HTTP %d", s.RegistrationEndpoint, resp.StatusCode)}
	}
	var r registration
	if err := json.Unmarshal(body, &r); err != nil || r.ClientID == "" {
		return nil, &DiscoveryError{Reason: fmt.Sprintf("dynamic client registration at %s answered without a client_id", s.RegistrationEndpoint)}
	}
	method := r.TokenEndpointAuthMethod
	switch {
	case method == "" && r.ClientSecret != "":
		method = authBasic
	case method == "":
		method = authNone
	case method != authNone && method != authPost && method != authBasic:
		return nil, &DiscoveryError{Reason: fmt.Sprintf("the authorization server %s registered the service for token_endpoint_auth_method %q, which it does not support",
			s.Issuer, method)}
	}
	sealed, err := m.box.SealBytes([]byte(r.ClientSecret), clientSecretContext(s.Issuer, m.cfg.RedirectURL))
	if err != nil {
		return nil, fmt.Errorf("seal the client secret of %s: %w", s.Issuer, err)
	}
	stored, inserted, err := m.db.AddOAuthClient(ctx, &store.OAuthClient{
		Issuer: s.Issuer, RedirectURI: m.cfg.RedirectURL, ClientID: r.ClientID, SealedSecret: sealed,
		AuthMethod: method, Kind: store.OAuthClientDCR,
	})
	if err != nil {
		return nil, err
	}
	if inserted {
		m.log.InfoContext(ctx, "registered with an authorization server", slog.String("issuer", s.Issuer),
			slog.String("client_id", r.ClientID), slog.String("token_endpoint_auth_method", method))
	} else {
		m.log.InfoContext(ctx, "another replica registered with the authorization server first; using its registration",
			slog.String("issuer", s.Issuer), slog.String("client_id", stored.ClientID))
	}
	return m.storedClient(ctx, s.Issuer)
}
