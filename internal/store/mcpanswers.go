package store

import (
	"context"
	"fmt"
)

// MCPAnswersChannel carries an MCP client's answer to a question (a
// JSON-RPC response) that reached a replica other than the one whose open
// call asked it: every replica hears it, and the one holding the call
// hands it on. The payload is the MCP endpoint's own.
const MCPAnswersChannel = "mcp_answers"

// MaxMCPAnswerBytes bounds one answer's payload: NOTIFY takes at most
// 8000 bytes.
const MaxMCPAnswerBytes = 7900

// PublishMCPAnswer sends payload on MCPAnswersChannel.
func (db *DB) PublishMCPAnswer(ctx context.Context, payload []byte) error {
	if len(payload) > MaxMCPAnswerBytes {
		return fmt.Errorf("the answer is %d bytes, over the %d an answer relayed between replicas may have", len(payload), MaxMCPAnswerBytes)
	}
	if _, err := db.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, MCPAnswersChannel, string(payload)); err != nil {
		return fmt.Errorf("relay an MCP answer: %w", err)
	}
	return nil
}
