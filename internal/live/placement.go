package live

import (
	"context"
	"errors"
	"log/slog"

	"github.com/connector-svc/connector-svc/internal/cluster"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Owned places connectors by their cluster ownership: every replica holds
// an HTTP or SSE connector (its own MCP session serves its callers, with no
// hop), only the owner holds a stdio one (one process, not one per
// replica; the others forward its calls). Only the owner health-checks,
// syncs the catalog and writes health.
func Owned(owners *cluster.Owners, logger *slog.Logger) Placement {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &owned{owners: owners, logger: logger}
}

type owned struct {
	owners *cluster.Owners
	logger *slog.Logger
}

func (p *owned) Holds(row *store.Connector) bool {
	if row.Transport != registry.TransportStdio {
		return true
	}
	_, ok := p.owners.Owned(row.ID)
	return ok
}

func (p *owned) Owns(id int64) bool {
	_, ok := p.owners.Owned(id)
	return ok
}

func (p *owned) Claim(ctx context.Context, id int64) {
	if _, _, err := p.owners.Claim(ctx, id); err != nil && ctx.Err() == nil && !errors.Is(err, cluster.ErrNotLive) {
		p.logger.WarnContext(ctx, "claim a new connector", slog.Int64("id", id), slog.String("error", err.Error()))
	}
}
