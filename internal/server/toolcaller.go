package server

import (
	"context"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
)

// ToolCaller is the agent's view of the registry: it runs the agent's tool
// calls with the registry, translating the orchestrator's call options
// (session, user, progress, retry with input answers, task id) into the
// registry's, and a user's missing
// authorization into an orchestrator.AuthorizationError, so that neither
// package imports the other.
type ToolCaller struct{ Registry *registry.Registry }

// CallTool implements orchestrator.ToolCaller.
func (t ToolCaller) CallTool(ctx context.Context, id int64, name string, args map[string]any, opts orchestrator.CallOptions) (*mcp.CallToolResult, error) {
	ro := registry.CallOptions{Session: opts.Session, UserID: opts.UserID, Retry: opts.Retry, TaskID: opts.TaskID,
		Restarted: opts.Restarted}
	if fn := opts.Progress; fn != nil {
		ro.Progress = func(p registry.Progress) { fn(orchestrator.Progress(p)) }
	}
	res, err := t.Registry.CallTool(ctx, id, name, args, ro)
	if required, ok := asRequired(err); ok && opts.UserID != "" {
		// The run pauses for its user's authorization; the call runs
		// again when it is resumed.
		return nil, &orchestrator.AuthorizationError{Err: err, Reason: required.Reason, Scopes: required.Scopes}
	}
	return res, err
}

// Resources implements orchestrator.ResourceReader: the connector's
// resources as last listed.
func (t ToolCaller) Resources(ctx context.Context, id int64, _ orchestrator.CallOptions) ([]mcp.Resource, bool) {
	k, err := t.Registry.Contents(ctx, id, false)
	if err != nil || !k.Caps.Resources {
		return nil, false
	}
	return k.Resources, true
}

// ReadResource implements orchestrator.ResourceReader.
func (t ToolCaller) ReadResource(ctx context.Context, id int64, uri string, opts orchestrator.CallOptions) (*mcp.ReadResourceResult, error) {
	return t.Registry.ReadResource(ctx, id, uri, registry.CallOptions{Session: opts.Session, UserID: opts.UserID})
}
