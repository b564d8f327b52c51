package mcpserve

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// On the workspace endpoint a tool is named <connector>__<tool>: the
// connector's id, two underscores, the server's tool name. Names keep to
// the 64 characters of [a-zA-Z0-9_-] that model APIs accept (MCP allows
// more), the same on every replica and after every restart: a name is a
// function of the connector's id and the tool's name alone.
//
// The separator cannot be faked: a connector id whose own text could make
// "__" ambiguous (one containing "__" or ".", or ending in "_") is written
// as its safe characters plus a hash of the whole id, which contains no
// "__" and does not end in "_". So in every name the first "__" ends the
// connector part, and two different (connector, tool) pairs never share
// a name unless their hashes collide, which listing checks (a clash gets
// a longer hash). A tool name with characters outside the set, or a name
// over 64 characters, is shortened the same way: a prefix, then "_" and a
// hash of the full pair.

const (
	// Separator is between the connector part and the tool part.
	Separator = "__"
	// maxToolName is the longest name model APIs take.
	maxToolName = 64
	// hashLen is the hex digits of the hash a shortened name carries.
	hashLen = 10
	// agentPrefix names a connector's agent tool: ask_<connector>.
	agentPrefix = "ask_"
)

// connectorPart is how connector id appears in names.
func connectorPart(id string) string {
	if !strings.Contains(id, "__") && !strings.Contains(id, ".") && !strings.HasSuffix(id, "_") && allowed(id) {
		return id
	}
	safe := strings.Map(func(r rune) rune {
		if r == '.' || r == '_' {
			return '-'
		}
		return r
	}, id)
	return safe + "-" + hash(id)[:hashLen]
}

// prefixedName is the workspace endpoint's name of connector's tool.
func prefixedName(connector, tool string) string {
	name := connectorPart(connector) + Separator + tool
	if len(name) <= maxToolName && allowed(tool) {
		return name
	}
	return shorten(name, connector+"\x00"+tool)
}

// agentName is the name of connector's agent tool.
func agentName(connector string) string {
	name := agentPrefix + connectorPart(connector)
	if len(name) <= maxToolName {
		return name
	}
	return shorten(name, "ask\x00"+connector)
}

// shorten fits name into maxToolName characters of the set: its allowed
// characters up to the room left, then "_" and a hash of key.
func shorten(name, key string) string {
	safe := strings.Map(func(r rune) rune {
		if isAllowed(r) {
			return r
		}
		return '_'
	}, name)
	room := maxToolName - 1 - hashLen
	if len(safe) > room {
		safe = safe[:room]
	}
	return safe + "_" + hash(key)[:hashLen]
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func allowed(s string) bool {
	for _, r := range s {
		if !isAllowed(r) {
			return false
		}
	}
	return s != ""
}

func isAllowed(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-'
}
