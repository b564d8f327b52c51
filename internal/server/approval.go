package server

import (
	"context"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/grpc/codes"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/live"
	"github.com/connector-svc/connector-svc/internal/store"
)

// The stored approval policies (live.PolicyNone, PolicyDestructive,
// PolicyAll), by their short names here.
const (
	policyNone        = live.PolicyNone
	policyDestructive = live.PolicyDestructive
	policyAll         = live.PolicyAll
)

// approvalPolicies maps the API's policies to the stored ones; a new
// connector that names none gets policyDestructive.
var approvalPolicies = map[connectorv1.ApprovalPolicy]string{
	connectorv1.ApprovalPolicy_APPROVAL_POLICY_UNSPECIFIED: policyDestructive,
	connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE:        policyNone,
	connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE: policyDestructive,
	connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL:         policyAll,
}

func approvalPolicyToProto(policy string) connectorv1.ApprovalPolicy {
	switch policy {
	case policyDestructive:
		return connectorv1.ApprovalPolicy_APPROVAL_POLICY_DESTRUCTIVE
	case policyAll:
		return connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL
	}
	return connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE
}

// storedNeedsApproval is needsApproval for a stored tool.
func storedNeedsApproval(policy string, t *store.Tool) bool {
	return live.NeedsApproval(policy, mcp.Tool{Annotations: mcp.ToolAnnotation{
		ReadOnlyHint: t.Annotations.ReadOnlyHint, DestructiveHint: t.Annotations.DestructiveHint,
	}}, t.RequiresApproval)
}

// approvalOverrideToProto renders a stored override.
func approvalOverrideToProto(override *bool) connectorv1.ApprovalOverride {
	switch {
	case override == nil:
		return connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_POLICY
	case *override:
		return connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_ALWAYS
	default:
		return connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_NEVER
	}
}

// approvalFlags reads an UpdateToolRequest's approval change into c's
// findings and f.
func approvalFlags(c *checker, req *connectorv1.UpdateToolRequest, f *store.ToolFlags) {
	o := req.GetApprovalOverride()
	if req.RequiresApproval != nil {
		if o != connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_UNSPECIFIED {
			c.add("requires_approval", "set requires_approval or approval_override, not both")
			f.SetApproval = true // something was set: that is not the problem
			return
		}
		f.SetApproval, f.RequiresApproval = true, req.RequiresApproval
		return
	}
	yes, no := true, false
	switch o {
	case connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_UNSPECIFIED:
	case connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_POLICY:
		f.SetApproval = true
	case connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_ALWAYS:
		f.SetApproval, f.RequiresApproval = true, &yes
	case connectorv1.ApprovalOverride_APPROVAL_OVERRIDE_NEVER:
		f.SetApproval, f.RequiresApproval = true, &no
	default:
		c.add("approval_override", "unknown value %d: use APPROVAL_OVERRIDE_POLICY, APPROVAL_OVERRIDE_ALWAYS or APPROVAL_OVERRIDE_NEVER", o)
	}
}

// approvalRequired is the refusal of a direct call that needs approval.
func approvalRequired(tool string) error {
	return newStatus(codes.FailedPrecondition, ReasonApprovalRequired, fmt.Sprintf(
		"tool %q needs a person's approval: show the call to the user, and call again with user_approved once they approve", tool))
}

// checkApproval refuses a direct call of a tool that needs approval,
// unless the caller says it has the user's. A tool that may not be called
// (not listed, disabled) is left to the call, which says why.
func (s *Server) checkApproval(ctx context.Context, id int64, req callRequest, user string) error {
	if req.GetUserApproved() {
		return nil
	}
	la, err := s.live.Settings(id, func() (*store.Connector, error) {
		return s.activeConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	})
	if err != nil {
		return err
	}
	cat, err := s.reg.CatalogFor(ctx, id, user)
	if err != nil {
		return err
	}
	t, override, ok := cat.Tool(req.GetToolName())
	if ok && live.NeedsApproval(la.Row.Config.ApprovalPolicy, t, override) {
		return approvalRequired(req.GetToolName())
	}
	return nil
}
