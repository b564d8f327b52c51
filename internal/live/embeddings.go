package live

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"sync"
	"time"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/store"
)

// embeddings gives each live agent its tools' embeddings, for the semantic
// ranking of narrowing, when an embeddings model is configured. When an
// agent is built for a new catalog version, a background job reads the
// stored embeddings, embeds the tools whose text is new or changed (in
// batches), stores those, and hands the agent all of them. Until then, and
// if it fails, the agent ranks by words alone.
type embeddings struct {
	db     EmbeddingStore
	embed  orchestrator.Embedder
	model  string
	logger *slog.Logger

	sem    chan struct{} // jobs at once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// embedBatch is how many texts one embeddings request carries.
const embedBatch = 64

func newEmbeddings(db EmbeddingStore, embed orchestrator.Embedder, model string, logger *slog.Logger) *embeddings {
	if embed == nil || model == "" {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &embeddings{db: db, embed: embed, model: model, logger: logger, sem: make(chan struct{}, 2), ctx: ctx, cancel: cancel}
}

// fill starts the job for la's agent of catalog version.
func (e *embeddings) fill(la *Agent, version uint64, tools []orchestrator.Tool) {
	if e == nil || len(tools) == 0 {
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		select {
		case e.sem <- struct{}{}:
		case <-e.ctx.Done():
			return
		}
		defer func() { <-e.sem }()
		start := time.Now()
		byName, computed, err := e.vectors(la.Row.ID, tools)
		attrs := append(ConnectorAttrs(la.Row), slog.Int("tools", len(tools)), slog.Int("embedded", computed),
			slog.Duration("took", time.Since(start)))
		if err != nil {
			e.logger.Warn("tool embeddings; narrowing ranks by words alone", append(attrs, slog.String("error", err.Error()))...)
			return
		}
		la.attach(version, byName)
		e.logger.Debug("tool embeddings ready", attrs...)
	}()
}

// vectors returns the embeddings of tools by name, computing and storing
// those not stored for their current text, and how many it computed.
func (e *embeddings) vectors(connectorID int64, tools []orchestrator.Tool) (map[string][]float32, int, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	stored, err := e.db.ToolEmbeddings(ctx, connectorID, e.model)
	if err != nil {
		return nil, 0, err
	}
	known := make(map[string]store.ToolEmbedding, len(stored))
	for _, s := range stored {
		known[s.Name] = s
	}
	byName := make(map[string][]float32, len(tools))
	var todo []store.ToolEmbedding
	var texts []string
	for _, t := range tools {
		text := orchestrator.EmbeddingText(t)
		sum := sha256.Sum256([]byte(text))
		if s, ok := known[t.Name]; ok && bytes.Equal(s.TextSHA256, sum[:]) {
			byName[t.Name] = s.Vector
			continue
		}
		todo = append(todo, store.ToolEmbedding{Name: t.Name, TextSHA256: sum[:]})
		texts = append(texts, text)
	}
	for i := 0; i < len(todo); i += embedBatch {
		end := min(i+embedBatch, len(todo))
		vecs, err := e.embed.Embed(ctx, texts[i:end])
		if err != nil {
			return nil, i, err
		}
		for j, v := range vecs {
			todo[i+j].Vector = v
			byName[todo[i+j].Name] = v
		}
		if err := e.db.SaveToolEmbeddings(ctx, connectorID, e.model, todo[i:end]); err != nil {
			return nil, end, err
		}
	}
	return byName, len(todo), nil
}

// close stops the jobs and waits for them.
func (e *embeddings) close() {
	if e == nil {
		return
	}
	e.cancel()
	e.wg.Wait()
}
