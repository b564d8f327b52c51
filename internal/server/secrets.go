package server

import (
	"slices"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/secret"
	"github.com/connector-svc/connector-svc/internal/store"
)

// secretsFromProto is the write-only values of p: its header and env values
// and its URL's query values. A query value that is literally REDACTED, as
// responses show it, keeps the value of the same parameter in stored; with
// none to keep, the URL is invalid. A query without any value needs no
// sealing and gives none.
func secretsFromProto(p *connectorv1.Connector, stored []secret.Param) (secret.Values, error) {
	_, query := secret.SplitURL(p.GetHttp().GetUrl())
	if err := keepRedacted(query, stored); err != nil {
		return secret.Values{}, err
	}
	if !slices.ContainsFunc(query, func(q secret.Param) bool { return q.Value != "" }) {
		query = nil
	}
	return secret.Values{Headers: p.GetHttp().GetHeaders(), Env: p.GetStdio().GetEnv(), Query: query,
		ClientSecret: p.GetAuth().GetClientSecret()}, nil
}

// keepRedacted gives the n-th parameter of query of a name whose value is
// REDACTED the value of the n-th parameter of that name in stored, so
// repeated names keep their values in order.
func keepRedacted(query, stored []secret.Param) error {
	var c checker
	seen := map[string]int{}
	for i, q := range query {
		n := seen[q.Name]
		seen[q.Name]++
		if q.Value != secret.Redacted {
			continue
		}
		old := nth(stored, q.Name, n)
		if old == nil {
			c.add("connector.http.url", "query parameter %q is %s, the placeholder responses show: give its value "+
				"(only a parameter the connector already has keeps its value this way)", q.Name, secret.Redacted)
			continue
		}
		query[i].Value = old.Value
	}
	return c.err()
}

// nth returns the n-th parameter named name in query, counting from 0, or
// nil.
func nth(query []secret.Param, name string, n int) *secret.Param {
	for i := range query {
		if query[i].Name != name {
			continue
		}
		if n == 0 {
			return &query[i]
		}
		n--
	}
	return nil
}

// resealed returns the sealed secrets of merged, the stored connector with
// an update applied. Header and env values are merged's if the update
// replaced them and the stored ones otherwise; query values are those of
// merged's URL, a REDACTED value keeping the stored one; the OAuth client
// secret is merged's if the update set it (clientSecret), else the stored
// one while merged keeps an OAuth mode. If nothing secret changed, the
// stored bytes are kept as they are.
func (s *Server) resealed(stored *store.Connector, merged *connectorv1.Connector, replaced, clientSecret bool) ([]byte, error) {
	binding := live.SealContext(stored.WorkspaceID, stored.ExternalID)
	old, err := s.box.Open(stored.SealedSecrets, binding)
	if err != nil {
		return nil, err
	}
	storedQuery := old.Query
	if len(storedQuery) == 0 {
		// A connector stored before query values were sealed has them in
		// its URL.
		_, storedQuery = secret.SplitURL(stored.Config.URL)
	}
	vals, err := secretsFromProto(merged, storedQuery)
	if err != nil {
		return nil, err
	}
	if !clientSecret {
		vals.ClientSecret = old.ClientSecret
	}
	if authModes[merged.GetAuth().GetMode()] == store.AuthNone {
		vals.ClientSecret = "" // no OAuth, no client
	}
	if !replaced {
		if slices.Equal(vals.Query, old.Query) && vals.ClientSecret == old.ClientSecret {
			return stored.SealedSecrets, nil
		}
		vals.Headers, vals.Env = old.Headers, old.Env
	}
	return s.box.Seal(vals, binding)
}
