package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// What a connector's servers may ask of it is set on create and update,
// checked as a whole, and shown back as set.
func TestAskBackSettings(t *testing.T) {
	f := setup(t)

	shared := httpConnector("shared")
	shared.Elicitation = true
	_, err := f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: shared})
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "connector.elicitation")

	bad := httpConnector("bad")
	bad.Sampling = &connectorv1.SamplingConfig{Enabled: true, MaxRequestsPerRun: -1, Policy: 7}
	_, err = f.client.CreateConnector(ctx(t), &connectorv1.CreateConnectorRequest{WorkspaceId: "ws", Connector: bad})
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "connector.sampling.max_requests_per_run")
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "connector.sampling.policy")

	c := httpConnector("a")
	c.SessionMode = connectorv1.SessionMode_SESSION_MODE_PER_SESSION
	c.Elicitation = true
	c.Sampling = &connectorv1.SamplingConfig{Enabled: true, MaxTokensPerRequest: 256}
	got := f.create(t, "ws", c)
	if !got.GetElicitation() || !got.GetSampling().GetEnabled() || got.GetSampling().GetMaxTokensPerRequest() != 256 ||
		got.GetSampling().GetPolicy() != connectorv1.SamplingPolicy_SAMPLING_POLICY_AUTO {
		t.Fatalf("created: elicitation %t, sampling %v", got.GetElicitation(), got.GetSampling())
	}

	up, err := update(f, t, &connectorv1.Connector{ConnectorId: "a", Sampling: &connectorv1.SamplingConfig{
		MaxRequestsPerRun: 3, Policy: connectorv1.SamplingPolicy_SAMPLING_POLICY_APPROVE}},
		"sampling.max_requests_per_run", "sampling.policy")
	if err != nil {
		t.Fatal(err)
	}
	if s := up.GetSampling(); !s.GetEnabled() || s.GetMaxTokensPerRequest() != 256 || s.GetMaxRequestsPerRun() != 3 ||
		s.GetPolicy() != connectorv1.SamplingPolicy_SAMPLING_POLICY_APPROVE {
		t.Fatalf("after a partial update: %v", s)
	}

	// Back to a shared connection: elicitation would reach nobody.
	_, err = update(f, t, &connectorv1.Connector{ConnectorId: "a", SessionMode: connectorv1.SessionMode_SESSION_MODE_SHARED},
		"session_mode")
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "connector.elicitation")
	up, err = update(f, t, &connectorv1.Connector{ConnectorId: "a", SessionMode: connectorv1.SessionMode_SESSION_MODE_SHARED},
		"session_mode", "elicitation", "sampling")
	if err != nil {
		t.Fatal(err)
	}
	if up.GetElicitation() || up.GetSampling() != nil {
		t.Fatalf("cleared: elicitation %t, sampling %v", up.GetElicitation(), up.GetSampling())
	}
}
