package server

import (
	"slices"
	"strings"
	"testing"

	"github.com/connector-svc/connector-svc/internal/auth"
)

// TestScopeMethodsAreTheGuardsTable: ScopeMethods lists exactly the
// ConnectorService RPCs whose access rule needs the scope.
func TestScopeMethodsAreTheGuardsTable(t *testing.T) {
	for _, scope := range []auth.Scope{auth.ScopeAdmin, auth.ScopeQuery} {
		var want []string
		for method, rule := range accessRules() {
			if name, ok := strings.CutPrefix(method, "/connector.v1.ConnectorService/"); ok && rule.Scope == scope {
				want = append(want, name)
			}
		}
		got := ScopeMethods(scope)
		slices.Sort(want)
		sorted := slices.Sorted(slices.Values(got))
		if !slices.Equal(sorted, want) || len(want) == 0 {
			t.Errorf("ScopeMethods(%s) = %v, want %v", scope, got, want)
		}
	}
}
