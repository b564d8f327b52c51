package server

import (
	"testing"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
)

// TestEveryRPCHasAnAccessRule fails when an RPC is added to the proto
// without a scope: the guard would refuse it to everyone.
func TestEveryRPCHasAnAccessRule(t *testing.T) {
	rules := accessRules()
	desc := connectorv1.ConnectorService_ServiceDesc
	var methods []string
	for _, m := range desc.Methods {
		methods = append(methods, "/"+desc.ServiceName+"/"+m.MethodName)
	}
	for _, s := range desc.Streams {
		methods = append(methods, "/"+desc.ServiceName+"/"+s.StreamName)
	}
	for _, m := range methods {
		rule, ok := rules[m]
		if !ok {
			t.Errorf("%s has no access rule in accessRules", m)
			continue
		}
		if m == connectorv1.ConnectorService_CompleteAuthorization_FullMethodName && !rule.NoKey && rule.Scope == "" {
			continue // names no workspace (its state does): any valid key
		}
		if rule.NoKey || (rule.Scope != auth.ScopeAdmin && rule.Scope != auth.ScopeQuery && rule.Scope != auth.ScopeCall) {
			t.Errorf("%s: rule %+v; every ConnectorService RPC needs scope admin, query or call", m, rule)
		}
	}
	if len(methods) < 15 {
		t.Errorf("found only %d RPCs in the service descriptor", len(methods))
	}
}
