package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// settingsKey is the setting whose value keys the fingerprint's hashes.
const settingsKey = "SECRET_KEY"

// sharedSettings are the settings that must match across the replicas on
// one database, because a call, a query or an authorization may be served
// by any of them, or begun on one and finished on another (README,
// Several replicas). Each is named as its environment variable.
func sharedSettings(cfg config) map[string]string {
	sampling := cfg.AskBack.Sampling
	return map[string]string{
		// Where queries and servers' sampling requests go: a query, or a
		// paused run resumed, may run on any replica.
		"LLM_BASE_URL":                cfg.LLMBaseURL,
		"LLM_MODEL":                   cfg.LLMModel,
		"EMBEDDINGS_MODEL":            cfg.EmbeddingsModel,
		"NARROW_TOOLS_ABOVE":          fmt.Sprint(cfg.NarrowToolsAbove),
		"NARROW_TOOLS_TO":             fmt.Sprint(cfg.NarrowToolsTo),
		"AGENT_RESOURCE_BUDGET_BYTES": fmt.Sprint(cfg.AgentResourceBudget),
		// What a connector may run or reach: it is created on one replica
		// and run by its owner.
		"STDIO_ALLOWED_COMMANDS": sortedList(cfg.StdioAllowedCommands),
		"EGRESS_ALLOW_CIDRS":     fmt.Sprint(cfg.EgressAllow),
		"EGRESS_DENY_CIDRS":      fmt.Sprint(cfg.EgressDeny),
		// An authorization started on one replica completes on another.
		"OAUTH_REDIRECT_URL":        cfg.OAuth.RedirectURL,
		"OAUTH_CLIENT_METADATA_URL": cfg.OAuth.ClientMetadataURL,
		"OAUTH_RETURN_TO_ALLOWED":   sortedList(cfg.OAuth.ReturnToAllowed),
		// Whether the internal hop is TLS: a plaintext replica and a TLS
		// one cannot forward to each other.
		"INTERNAL_TLS": presence(cfg.InternalTLS.CertFile != ""),
		// Who may call, and what a call's outcome is wherever it lands.
		"AUTH":                     string(cfg.Auth),
		"APPROVAL_TIMEOUT":         cfg.ApprovalTimeout.String(),
		"ELICITATION_TIMEOUT":      cfg.ElicitationTimeout.String(),
		"MAX_TOOL_RESULT_BYTES":    fmt.Sprint(cfg.MaxToolResultBytes),
		"MAX_TOOL_ARGUMENTS_BYTES": fmt.Sprint(cfg.MaxToolArgumentsBytes),
		"SAMPLING_DEFAULTS": fmt.Sprint(sampling.MaxTokensPerRequest, sampling.MaxRequestsPerRun, sampling.MaxTokensPerRun,
			sampling.MaxRequestsPerMinute, sampling.MaxTokensPerMinute),
	}
}

// settingsFingerprint is what this replica publishes in its membership
// row: for each shared setting, an HMAC-SHA256 of its value under a key
// derived from the first SECRET_KEY (the sealing key, the same on every
// replica), so nothing of a value can be learnt or guessed from the
// database; SECRET_KEY itself is a MAC of a constant under that key. An
// LLM_API_KEY counts by presence only: replicas may use keys of their
// own. Without SECRET_KEY (one replica alone: others refuse to join it)
// each setting is published as set or unset.
func settingsFingerprint(cfg config, keys [][]byte) map[string]string {
	values := sharedSettings(cfg)
	out := make(map[string]string, len(values)+2)
	out["LLM_API_KEY"] = presence(cfg.LLMAPIKey != "")
	if len(keys) == 0 {
		out[settingsKey] = presence(false)
		for name, v := range values {
			out[name] = presence(v != "")
		}
		return out
	}
	key := mac(keys[0], "connector-svc replica settings fingerprint")
	out[settingsKey] = hex.EncodeToString(mac(key, settingsKey))[:32]
	for name, v := range values {
		out[name] = hex.EncodeToString(mac(key, name+"\x00"+v))[:32]
	}
	return out
}

func mac(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

func presence(set bool) string {
	if set {
		return "set"
	}
	return "unset"
}

func sortedList(vs []string) string {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	return strings.Join(vs, ",")
}
