package server

import (
	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
)

// ScopeMethods are the names (CallTool, …) of the ConnectorService RPCs
// that need scope s, unary ones first, each in the order the service
// defines them. They are read from the table the auth guard enforces, so
// that help texts cannot drift from it.
func ScopeMethods(s auth.Scope) []string {
	desc := connectorv1.ConnectorService_ServiceDesc
	var names []string
	for _, m := range desc.Methods {
		names = append(names, m.MethodName)
	}
	for _, st := range desc.Streams {
		names = append(names, st.StreamName)
	}
	rules := accessRules()
	var out []string
	for _, name := range names {
		if rules["/"+desc.ServiceName+"/"+name].Scope == s {
			out = append(out, name)
		}
	}
	return out
}

// ScopeOf is the scope the API key guard asks of a method (its full name,
// "/connector.v1.ConnectorService/CallTool"); "" for a method any valid key
// may call, or that needs none.
func ScopeOf(fullMethod string) auth.Scope { return accessRules()[fullMethod].Scope }
