package server

import (
	"github.com/mark3labs/mcp-go/mcp"

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
