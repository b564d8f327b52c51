package oauthtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/ory/fosite"
)

// AdminScope is the scope admin_action needs.
const AdminScope = "admin"

// identity is who an MCP request's token speaks for.
type identity struct {
	subject string
	scopes  []string
}

type identityKey struct{}

// prmPath is where the protected resource metadata is, per Options.PRMAt.
func (s *Server) prmPath() string {
	switch s.opts.PRMAt {
	case "root":
		return "/.well-known/oauth-protected-resource"
	case "header-only":
		return "/prm-x"
	default:
		return "/.well-known/oauth-protected-resource/mcp"
	}
}

// PRMURL is the URL of the protected resource metadata (the one the
// challenges name).
func (s *Server) PRMURL() string { return s.rsOrigin + s.prmPath() }

// resourceHandler serves the MCP endpoint behind the token check, and the
// protected resource metadata.
func (s *Server) resourceHandler() http.Handler {
	m := mcpserver.NewMCPServer("oauthtest", "1.0.0", mcpserver.WithToolCapabilities(false))
	m.AddTool(mcp.NewTool("whoami", mcp.WithDescription("Says whose token the call was made with and its scopes.")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			id, _ := ctx.Value(identityKey{}).(identity)
			text := fmt.Sprintf("user=%s scopes=%s", id.subject, strings.Join(id.scopes, " "))
			return mcp.NewToolResultStructured(map[string]any{"user": id.subject, "scopes": id.scopes}, text), nil
		})
	m.AddTool(mcp.NewTool("admin_action", mcp.WithDescription("Needs scope admin.")),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			id, _ := ctx.Value(identityKey{}).(identity)
			if !fosite.Arguments(id.scopes).Has(AdminScope) {
				return mcp.NewToolResultError("scope admin is needed"), nil
			}
			return mcp.NewToolResultText("admin done for " + id.subject), nil
		})
	h := mcpserver.NewStreamableHTTPServer(m, mcpserver.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
		if id, ok := r.Context().Value(identityKey{}).(identity); ok {
			ctx = context.WithValue(ctx, identityKey{}, id)
		}
		return ctx
	}))

	mux := http.NewServeMux()
	mux.Handle("/mcp", s.guard(h))
	mux.HandleFunc(s.prmPath(), func(w http.ResponseWriter, r *http.Request) {
		s.observe("prm", r)
		if r.Method != http.MethodGet {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		s.counts.prmFetches.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{
			"resource":                 s.MCPURL,
			"authorization_servers":    []string{s.Issuer},
			"scopes_supported":         s.opts.Scopes,
			"bearer_methods_supported": []string{"header"},
		})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.observe("", r)
		http.NotFound(w, r)
	})
	return mux
}

// guard lets through to next only requests with a valid bearer token for
// this resource, and a call of admin_action only with scope admin.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.observe("mcp", r)
		s.counts.mcpRequests.Add(1)
		auth := r.Header.Get("Authorization")
		if auth == "" {
			s.challenge(w, http.StatusUnauthorized, "", "", s.opts.ChallengeScope)
			return
		}
		scheme, token, _ := strings.Cut(auth, " ")
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			s.challenge(w, http.StatusUnauthorized, "invalid_request", "The Authorization header is not a bearer token.", s.opts.ChallengeScope)
			return
		}
		id, why := s.check(r.Context(), token)
		if why != "" {
			s.challenge(w, http.StatusUnauthorized, "invalid_token", why, s.opts.ChallengeScope)
			return
		}
		if r.Method == http.MethodPost && !fosite.Arguments(id.scopes).Has(AdminScope) {
			body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
			if err != nil {
				http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if callsTool(body, "admin_action") {
				scope := s.opts.StepUpScope
				if scope == "" {
					scope = s.opts.ChallengeScope + " " + AdminScope
				}
				s.challenge(w, http.StatusForbidden, "insufficient_scope", "admin_action needs scope admin.", scope)
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// check says who token speaks for, or why it is not valid here.
func (s *Server) check(ctx context.Context, token string) (identity, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	use, ar, err := s.provider.IntrospectToken(ctx, token, fosite.AccessToken, &fosite.DefaultSession{})
	if err != nil {
		return identity{}, "The access token is not valid: " + fosite.ErrorToRFC6749Error(err).ErrorField + "."
	}
	if use != fosite.AccessToken {
		return identity{}, "The token is not an access token."
	}
	if s.expired[s.strategy.AccessTokenSignature(ctx, token)] {
		return identity{}, "The access token expired."
	}
	if !ar.GetGrantedAudience().Has(s.MCPURL) {
		return identity{}, "The access token is not for this resource."
	}
	return identity{subject: ar.GetSession().GetSubject(), scopes: append([]string(nil), ar.GetGrantedScopes()...)}, ""
}

// callsTool says whether body, a JSON-RPC message or batch, calls tool.
func callsTool(body []byte, tool string) bool {
	type call struct {
		Method string `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	var calls []call
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		if json.Unmarshal(body, &calls) != nil {
			return false
		}
	} else {
		var c call
		if json.Unmarshal(body, &c) != nil {
			return false
		}
		calls = []call{c}
	}
	for _, c := range calls {
		if c.Method == "tools/call" && c.Params.Name == tool {
			return true
		}
	}
	return false
}

// challenge answers with status and a Bearer WWW-Authenticate challenge.
func (s *Server) challenge(w http.ResponseWriter, status int, code, desc, scope string) {
	var params []string
	if code != "" {
		params = append(params, fmt.Sprintf("error=%q", code))
	}
	if desc != "" {
		params = append(params, fmt.Sprintf("error_description=%q", desc))
	}
	if scope != "" {
		params = append(params, fmt.Sprintf("scope=%q", scope))
	}
	if !s.opts.NoChallengeMetadata {
		params = append(params, fmt.Sprintf("resource_metadata=%q", s.PRMURL()))
	}
	ch := "Bearer"
	if len(params) > 0 {
		ch += " " + strings.Join(params, ", ")
	}
	switch status {
	case http.StatusUnauthorized:
		s.counts.unauthorized.Add(1)
	case http.StatusForbidden:
		s.counts.forbidden.Add(1)
	}
	w.Header().Set("WWW-Authenticate", ch)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if code == "" {
		code = "unauthorized"
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
}
