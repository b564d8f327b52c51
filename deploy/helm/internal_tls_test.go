package helm_test

import (
	"testing"
)

// TestChartInternalTLS: the internal hop is mutual TLS when the gRPC port
// is TLS (from the same Secret, its CA, and the Service's DNS name), when
// internalTLS says so (its own Secret and name), and plaintext otherwise.
func TestChartInternalTLS(t *testing.T) {
	for _, c := range []struct {
		name       string
		args       []string
		secret     string // "" wants no internal TLS
		serverName string
	}{
		{"off by default", nil, "", ""},
		{"follows tls", []string{"--set", "tls.enabled=true", "--set", "tls.existingSecret=public-tls"},
			"public-tls", "demo-connector-svc.apps.svc"},
		{"tls but internalTLS off", []string{"--set", "tls.enabled=true", "--set", "tls.existingSecret=public-tls", "--set", "internalTLS.enabled=false"},
			"", ""},
		{"all on", []string{"-f", allOnValues}, "connector-internal-tls", "connector-internal.chat.svc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs := decode(t, render(t, c.args...))
			d := objs.deployments[0]
			ct := theContainer(t, d)
			env := envOf(ct)
			names := []string{"INTERNAL_TLS_CERT_FILE", "INTERNAL_TLS_KEY_FILE", "INTERNAL_TLS_CA_FILE", "INTERNAL_TLS_SERVER_NAME"}
			if c.secret == "" {
				for _, n := range names {
					if _, ok := env[n]; ok {
						t.Errorf("%s set without internal TLS", n)
					}
				}
				return
			}
			for _, n := range names[:3] {
				checkSecretFile(t, d, ct, env[n].Value, c.secret)
			}
			if got := env["INTERNAL_TLS_SERVER_NAME"].Value; got != c.serverName {
				t.Errorf("INTERNAL_TLS_SERVER_NAME = %q, want %q", got, c.serverName)
			}
		})
	}
}
