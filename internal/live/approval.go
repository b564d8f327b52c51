package live

import "github.com/mark3labs/mcp-go/mcp"

// Approval policies, as stored (store.Config.ApprovalPolicy). A connector
// stored before there were policies has none: it reads as PolicyNone.
const (
	PolicyNone        = "none"
	PolicyDestructive = "destructive"
	PolicyAll         = "all"
)

// NeedsApproval says whether a call of tool t waits for a person: the
// tool's override if an operator set one, else the connector's policy.
// Under PolicyDestructive only a tool its server annotates read-only runs
// unasked. MCP has a tool without hints count as destructive, and defines
// destructiveHint only for tools that are not read-only: mcp-go, for one,
// sends destructiveHint true with every tool unless told otherwise, its
// read-only ones included.
func NeedsApproval(policy string, t mcp.Tool, override *bool) bool {
	if override != nil {
		return *override
	}
	switch policy {
	case PolicyAll:
		return true
	case PolicyDestructive:
		readOnly := t.Annotations.ReadOnlyHint
		return readOnly == nil || !*readOnly
	}
	return false
}
