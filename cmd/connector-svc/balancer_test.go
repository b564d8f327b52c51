package main

// The gRPC server's policy for clients that balance over replicas (issue
// 19, item 3): its settings, connection age, the SIGTERM order, and a
// round-robin client with the documented service config over 3 replicas.

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestConnectionSettings reads the connection settings, defaults the grace
// from the longest default deadline, and refuses a grace that would cut a
// call under way.
func TestConnectionSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    connConfig
		wantErr string
	}{
		{"defaults", nil, nil, connConfig{MaxAge: 5 * time.Minute, MaxAgeGrace: 2*time.Minute + 30*time.Second,
			KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second}, ""},
		{"grace follows QUERY_TIMEOUT", nil, map[string]string{"QUERY_TIMEOUT": "10m"}, connConfig{MaxAge: 5 * time.Minute,
			MaxAgeGrace: 10*time.Minute + 30*time.Second, KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second}, ""},
		{"grace follows RPC_TIMEOUT when longer", nil, map[string]string{"RPC_TIMEOUT": "5m"}, connConfig{MaxAge: 5 * time.Minute,
			MaxAgeGrace: 5*time.Minute + 30*time.Second, KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second}, ""},
		{"environment", nil, map[string]string{"GRPC_MAX_CONNECTION_AGE": "1m", "GRPC_MAX_CONNECTION_AGE_GRACE": "3m",
			"GRPC_KEEPALIVE_TIME": "30s", "GRPC_KEEPALIVE_TIMEOUT": "5s", "SHUTDOWN_DELAY": "2s"},
			connConfig{MaxAge: time.Minute, MaxAgeGrace: 3 * time.Minute, KeepaliveTime: 30 * time.Second,
				KeepaliveTimeout: 5 * time.Second, ShutdownDelay: 2 * time.Second}, ""},
		{"flag over environment", []string{"-grpc-max-connection-age", "30s"}, map[string]string{"GRPC_MAX_CONNECTION_AGE": "1m"},
			connConfig{MaxAge: 30 * time.Second, MaxAgeGrace: 2*time.Minute + 30*time.Second, KeepaliveTime: time.Minute,
				KeepaliveTimeout: 20 * time.Second}, ""},
		{"grace below QUERY_TIMEOUT", nil, map[string]string{"GRPC_MAX_CONNECTION_AGE_GRACE": "1m"}, connConfig{},
			"GRPC_MAX_CONNECTION_AGE_GRACE 1m0s is below QUERY_TIMEOUT"},
		{"zero age", nil, map[string]string{"GRPC_MAX_CONNECTION_AGE": "0s"}, connConfig{}, "GRPC_MAX_CONNECTION_AGE"},
		{"bad keepalive", nil, map[string]string{"GRPC_KEEPALIVE_TIME": "often"}, connConfig{}, "GRPC_KEEPALIVE_TIME"},
		{"negative delay", nil, map[string]string{"SHUTDOWN_DELAY": "-1s"}, connConfig{}, "SHUTDOWN_DELAY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseConfig(tc.args, getenv(tc.env), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseConfig: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Conn != tc.want {
				t.Errorf("Conn = %+v, want %+v", cfg.Conn, tc.want)
			}
		})
	}
}
