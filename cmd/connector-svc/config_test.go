package main

import (
	"io"
	"testing"
)

// TestMaxIdleConnsSetting reads the connection pool's size from the
// environment, lets a flag override it, and refuses what is not positive.
func TestMaxIdleConnsSetting(t *testing.T) {
	const env = "MCP_HTTP_MAX_IDLE_CONNS_PER_CONNECTOR"
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    int
		wantErr bool
	}{
		{"default", nil, nil, 128, false},
		{"environment", nil, map[string]string{env: "200"}, 200, false},
		{"flag over environment", []string{"-mcp-http-max-idle-conns-per-connector", "8"}, map[string]string{env: "200"}, 8, false},
		{"zero", nil, map[string]string{env: "0"}, 0, true},
		{"not a number", nil, map[string]string{env: "many"}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseConfig(tc.args, getenv(tc.env), io.Discard)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseConfig: %v; want error %v", err, tc.wantErr)
			}
			if err == nil && cfg.MaxIdleConns != tc.want {
				t.Errorf("MaxIdleConns = %d, want %d", cfg.MaxIdleConns, tc.want)
			}
		})
	}
}
