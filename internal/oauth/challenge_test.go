package oauth

import (
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseChallenges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   []challenge
	}{{
		name:   "bearer with quoted params",
		values: []string{`Bearer resource_metadata="https://mcp.example/.well-known/oauth-protected-resource/mcp", scope="files:read files:write", error="invalid_token"`},
		want: []challenge{{scheme: "bearer", params: map[string]string{
			"resource_metadata": "https://mcp.example/.well-known/oauth-protected-resource/mcp",
			"scope":             "files:read files:write", "error": "invalid_token"}}},
	}, {
		name:   "quoted commas, escapes and equals",
		values: []string{`Bearer error_description="a, b \"c\" = d", realm=example`},
		want:   []challenge{{scheme: "bearer", params: map[string]string{"error_description": `a, b "c" = d`, "realm": "example"}}},
	}, {
		name:   "several challenges in one header",
		values: []string{`Basic realm="x", Bearer scope="a", error=insufficient_scope, DPoP algs="ES256"`},
		want: []challenge{
			{scheme: "basic", params: map[string]string{"realm": "x"}},
			{scheme: "bearer", params: map[string]string{"scope": "a", "error": "insufficient_scope"}},
			{scheme: "dpop", params: map[string]string{"algs": "ES256"}},
		},
	}, {
		name:   "several headers, bare scheme, token68",
		values: []string{`Negotiate abc==`, `Bearer`, `BEARER Resource_Metadata=https://x/prm`},
		want: []challenge{
			{scheme: "negotiate", params: map[string]string{"abc": "="}},
			{scheme: "bearer", params: map[string]string{}},
			{scheme: "bearer", params: map[string]string{"resource_metadata": "https://x/prm"}},
		},
	}, {
		name:   "spaces around equals, unterminated quote",
		values: []string{`Bearer  scope = "a b" ,error="invalid_token`},
		want:   []challenge{{scheme: "bearer", params: map[string]string{"scope": "a b", "error": "invalid_token"}}},
	}, {
		name:   "garbage",
		values: []string{`, ,"x" = , Bearer error="e"`},
		want:   []challenge{{scheme: "x", params: map[string]string{}}, {scheme: "bearer", params: map[string]string{"error": "e"}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseChallenges(tc.values)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(challenge{})); diff != "" {
				t.Errorf("parseChallenges(%q) (-want +got):\n%s", tc.values, diff)
			}
		})
	}
}

func TestBearerChallenge(t *testing.T) {
	h := http.Header{}
	h.Add("WWW-Authenticate", `Basic realm="r"`)
	h.Add("WWW-Authenticate", `Bearer error="insufficient_scope", scope="mcp:tools admin", resource_metadata="https://rs/prm"`)
	b := bearerChallenge(h)
	if !b.found || b.err != "insufficient_scope" || !slices.Equal(b.scope, []string{"mcp:tools", "admin"}) || b.resourceMetadata != "https://rs/prm" {
		t.Errorf("bearerChallenge = %+v", b)
	}
	if b := bearerChallenge(http.Header{"Www-Authenticate": {`Basic realm="r"`}}); b.found {
		t.Errorf("found a Bearer challenge in a Basic one: %+v", b)
	}
}

func TestDiscoveryURLs(t *testing.T) {
	u, _ := url.Parse("https://MCP.example:443/api/mcp/?k=secret#f")
	got := prmCandidates(u, "https://elsewhere/prm")
	want := []prmCandidate{
		{url: "https://elsewhere/prm", fromHeader: true},
		{url: "https://MCP.example:443/.well-known/oauth-protected-resource/api/mcp"},
		{url: "https://MCP.example:443/.well-known/oauth-protected-resource"},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(prmCandidate{})); diff != "" {
		t.Errorf("prmCandidates (-want +got):\n%s", diff)
	}
	root, _ := url.Parse("http://h:8080")
	if got := prmCandidates(root, ""); len(got) != 1 || got[0].url != "http://h:8080/.well-known/oauth-protected-resource" {
		t.Errorf("prmCandidates(root) = %v", got)
	}
	if got := canonicalURL(u); got != "https://mcp.example/api/mcp/" {
		t.Errorf("canonicalURL = %q", got)
	}

	for issuer, want := range map[string][]string{
		"https://as.example":  {"https://as.example/.well-known/oauth-authorization-server", "https://as.example/.well-known/openid-configuration"},
		"https://as.example/": {"https://as.example/.well-known/oauth-authorization-server", "https://as.example/.well-known/openid-configuration"},
		"https://as.example/tenant/1": {
			"https://as.example/.well-known/oauth-authorization-server/tenant/1",
			"https://as.example/.well-known/openid-configuration/tenant/1",
			"https://as.example/tenant/1/.well-known/openid-configuration",
		},
	} {
		got, err := serverMetadataURLs(issuer)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("serverMetadataURLs(%q) = %v, %v; want %v", issuer, got, err, want)
		}
	}
	for _, bad := range []string{"ftp://as", "https://as?x=1", "/relative"} {
		if _, err := serverMetadataURLs(bad); err == nil {
			t.Errorf("serverMetadataURLs(%q) accepted", bad)
		}
	}

	for _, tc := range []struct {
		prefix, resource string
		want             bool
	}{
		{"https://h/mcp", "https://h/mcp", true},
		{"https://H:443/mcp/", "https://h/mcp", true},
		{"https://h", "https://h/mcp", true},
		{"https://h/a", "https://h/a/b", true},
		{"https://h/a", "https://h/ab", false},
		{"https://other/mcp", "https://h/mcp", false},
		{"http://h/mcp", "https://h/mcp", false},
		{"https://h?x=1", "https://h/mcp", false},
	} {
		if got := resourceCovers(tc.prefix, tc.resource); got != tc.want {
			t.Errorf("resourceCovers(%q, %q) = %t", tc.prefix, tc.resource, got)
		}
	}
}
