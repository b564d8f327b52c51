package live

import (
	"context"

	"github.com/connector-svc/connector-svc/internal/store"
)

// Store is what the live state reads and writes in the database: the
// connector rows it follows, their tools and health. *store.DB implements
// it (and the smaller interfaces below).
type Store interface {
	ActiveConnectors(ctx context.Context) ([]*store.Connector, error)
	ConnectorByID(ctx context.Context, id int64) (*store.Connector, error)
	GetConnector(ctx context.Context, workspaceID, externalID string) (*store.Connector, error)
	ConnectorVersions(ctx context.Context) (map[int64]int64, error)
	ConnectorTools(ctx context.Context, id int64) ([]*store.Tool, error)
	SaveHealth(ctx context.Context, id int64, h store.Health) error
	EmbeddingStore
}

// SourceStore is what a Source needs: the rows it hands the registry, and
// where it writes back what the registry learns (tools, health, counters).
type SourceStore interface {
	ConnectorByID(ctx context.Context, id int64) (*store.Connector, error)
	ConnectorTools(ctx context.Context, id int64) ([]*store.Tool, error)
	SyncTools(ctx context.Context, connectorID int64, specs []store.ToolSpec, fence *store.Fence) (store.SyncResult, error)
	SaveHealth(ctx context.Context, id int64, h store.Health) error
	SaveHealthFenced(ctx context.Context, id int64, f store.Fence, h store.Health) error
	AddCounters(ctx context.Context, id int64, d store.Counters) error
}

// SessionStore is what Sessions needs: the claims that cap and place
// per-session connections across replicas.
type SessionStore interface {
	ClaimSession(ctx context.Context, id int64, sessionID, workspaceID, replica string, max int, force bool) (store.SessionClaim, error)
	SetSessionHandle(ctx context.Context, id int64, sessionID, replica string, sealed []byte) error
	DropSession(ctx context.Context, id int64, sessionID, replica string) error
	DropOrphanSessions(ctx context.Context, workspaceID, sessionID string, id int64) (int64, error)
}

// EmbeddingStore keeps the tools' embeddings per connector and model.
type EmbeddingStore interface {
	ToolEmbeddings(ctx context.Context, connectorID int64, model string) ([]store.ToolEmbedding, error)
	SaveToolEmbeddings(ctx context.Context, connectorID int64, model string, es []store.ToolEmbedding) error
}

var (
	_ Store        = (*store.DB)(nil)
	_ SourceStore  = (*store.DB)(nil)
	_ SessionStore = (*store.DB)(nil)
)
