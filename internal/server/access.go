package server

import (
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
)

// accessRules says who may call each RPC when auth is on. Admin is the
// lifecycle of connectors, tools and keys (a stdio connector runs a command
// on the host); query is queries; call is tool calls, their answers and
// sessions. An admin key may also query, and a query key call. Health needs no key, reflection any valid key. An RPC missing here
// is refused to everyone (TestEveryRPCHasAnAccessRule keeps it complete).
func accessRules() auth.Rules {
	admin := auth.Rule{Scope: auth.ScopeAdmin}
	query := auth.Rule{Scope: auth.ScopeQuery}
	call := auth.Rule{Scope: auth.ScopeCall}
	return auth.Rules{
		connectorv1.ConnectorService_CreateConnector_FullMethodName:     admin,
		connectorv1.ConnectorService_GetConnector_FullMethodName:        admin,
		connectorv1.ConnectorService_ListConnectors_FullMethodName:      admin,
		connectorv1.ConnectorService_UpdateConnector_FullMethodName:     admin,
		connectorv1.ConnectorService_DeleteConnector_FullMethodName:     admin,
		connectorv1.ConnectorService_ActivateConnector_FullMethodName:   admin,
		connectorv1.ConnectorService_DeactivateConnector_FullMethodName: admin,
		connectorv1.ConnectorService_ListTools_FullMethodName:           admin,
		connectorv1.ConnectorService_UpdateTool_FullMethodName:          admin,
		connectorv1.ConnectorService_RefreshTools_FullMethodName:        admin,
		connectorv1.ConnectorService_CheckConnector_FullMethodName:      admin,
		connectorv1.ConnectorService_CreateApiKey_FullMethodName:        admin,
		connectorv1.ConnectorService_ListApiKeys_FullMethodName:         admin,
		connectorv1.ConnectorService_RevokeApiKey_FullMethodName:        admin,

		connectorv1.ConnectorService_CallTool_FullMethodName:             call,
		connectorv1.ConnectorService_StreamCallTool_FullMethodName:       call,
		connectorv1.ConnectorService_AnswerInput_FullMethodName:          call,
		connectorv1.ConnectorService_QueryConnector_FullMethodName:       query,
		connectorv1.ConnectorService_StreamQueryConnector_FullMethodName: query,
		connectorv1.ConnectorService_ResumeQuery_FullMethodName:          query,
		connectorv1.ConnectorService_StreamResumeQuery_FullMethodName:    query,
		connectorv1.ConnectorService_GetQueryRun_FullMethodName:          query,
		connectorv1.ConnectorService_ListQueryRuns_FullMethodName:        query,
		connectorv1.ConnectorService_ListSessions_FullMethodName:         call,
		// Resources, prompts and completions are read as tools are called.
		connectorv1.ConnectorService_ListResources_FullMethodName:         call,
		connectorv1.ConnectorService_ListResourceTemplates_FullMethodName: call,
		connectorv1.ConnectorService_ReadResource_FullMethodName:          call,
		connectorv1.ConnectorService_ListPrompts_FullMethodName:           call,
		connectorv1.ConnectorService_GetPrompt_FullMethodName:             call,
		connectorv1.ConnectorService_Complete_FullMethodName:              call,
		connectorv1.ConnectorService_WatchResources_FullMethodName:        call,
		connectorv1.ConnectorService_CloseSession_FullMethodName:          call,
		// A chat backend runs its end users' authorizations, lists and
		// revokes them ("connected accounts"), as it closes their sessions.
		connectorv1.ConnectorService_StartAuthorization_FullMethodName: query,
		// It names no workspace: its state, single use and bound to one
		// user of one connector, says which; any valid key may hand in a
		// redirect it received, and learns nothing of another workspace's.
		connectorv1.ConnectorService_CompleteAuthorization_FullMethodName: {},
		connectorv1.ConnectorService_ListAuthorizations_FullMethodName:    query,
		connectorv1.ConnectorService_RevokeAuthorization_FullMethodName:   query,

		healthpb.Health_ServiceDesc.ServiceName:                    {NoKey: true},
		reflectionv1.ServerReflection_ServiceDesc.ServiceName:      {},
		reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName: {},
	}
}
