package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ToolEmbedding is a tool's embedding by one model, made of the text whose
// SHA-256 it keeps.
type ToolEmbedding struct {
	Name       string
	TextSHA256 []byte
	Vector     []float32
}

// ToolEmbeddings returns a connector's stored tool embeddings by model.
func (db *DB) ToolEmbeddings(ctx context.Context, connectorID int64, model string) ([]ToolEmbedding, error) {
	rows, err := db.pool.Query(ctx, `
		SELECT tool_name, text_sha256, embedding FROM tool_embeddings
		WHERE connector_id = $1 AND model = $2 ORDER BY tool_name`, connectorID, model)
	if err != nil {
		return nil, fmt.Errorf("tool embeddings of connector %d: %w", connectorID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ToolEmbedding, error) {
		var e ToolEmbedding
		err := row.Scan(&e.Name, &e.TextSHA256, &e.Vector)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("tool embeddings of connector %d: %w", connectorID, err)
	}
	return out, nil
}

// SaveToolEmbeddings stores embeddings of a connector's tools by model,
// replacing what was stored for those tools. A connector that is gone
// stores nothing, and that is no error.
func (db *DB) SaveToolEmbeddings(ctx context.Context, connectorID int64, model string, es []ToolEmbedding) error {
	batch := &pgx.Batch{}
	for _, e := range es {
		batch.Queue(`
			INSERT INTO tool_embeddings (connector_id, tool_name, model, text_sha256, embedding)
			SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM connectors WHERE id = $1)
			ON CONFLICT (connector_id, model, tool_name)
			DO UPDATE SET text_sha256 = excluded.text_sha256, embedding = excluded.embedding, updated_at = now()`,
			connectorID, e.Name, model, e.TextSHA256, e.Vector)
	}
	if err := db.pool.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("save tool embeddings of connector %d: %w", connectorID, err)
	}
	return nil
}
