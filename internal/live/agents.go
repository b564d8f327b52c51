package live

import (
	"sync"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// agents keeps each connector's live agent between queries: the stored
// settings a query needs (session mode, rate limit, model, name) and the
// orchestrator.Connector built from them and the registry's catalog. A
// query reads both from memory. The settings come from the store once, and
// again after Apply sees a new row (settle, forget); the agent is rebuilt
// when the registry publishes a new catalog version (a tool listed,
// changed, enabled or disabled).
type agents struct {
	mu   sync.Mutex
	byID map[int64]*Agent
	// gens counts the changes of each connector's row, so a row read from
	// the store before a change is not kept after it.
	gens map[int64]uint64
}

// Agent is one connector's live agent: its settings, which never change (a
// change makes a new Agent), and its agent for the newest catalog seen.
type Agent struct {
	// Row is the stored connector the agent was built from; read only.
	Row *store.Connector
	emb *embeddings

	mu      sync.Mutex
	agent   *orchestrator.Connector
	version uint64 // of the catalog agent was built from
}

// settings returns connector id's live agent, reading its row with load
// if it is not known yet.
func (a *agents) settings(id int64, load func() (*store.Connector, error), emb *embeddings) (*Agent, error) {
	a.mu.Lock()
	la, gen := a.byID[id], a.gens[id]
	a.mu.Unlock()
	if la != nil {
		return la, nil
	}
	row, err := load()
	if err != nil {
		return nil, err
	}
	la = &Agent{Row: row, emb: emb}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gens[id] != gen {
		return la, nil // changed meanwhile: use it this once, keep nothing
	}
	if kept := a.byID[id]; kept != nil {
		return kept, nil
	}
	if a.byID == nil {
		a.byID = map[int64]*Agent{}
	}
	a.byID[id] = la
	return la, nil
}

// settle makes row the connector's settings: Apply saw it.
func (a *agents) settle(row *store.Connector, emb *embeddings) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bump(row.ID)
	a.byID[row.ID] = &Agent{Row: row, emb: emb}
}

// forget drops a connector's live agent: deactivated or deleted.
func (a *agents) forget(id int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bump(id)
	delete(a.byID, id)
}

func (a *agents) bump(id int64) {
	if a.byID == nil {
		a.byID = map[int64]*Agent{}
	}
	if a.gens == nil {
		a.gens = map[int64]uint64{}
	}
	a.gens[id]++
}

// Connector returns the agent for cat, built now if cat is newer than the
// one the agent has (an older one, read by a query that raced a change,
// gets the newer agent). Building is CPU work only, done once per version
// while the connector's other queries wait for it; the tools' embeddings
// come later, in the background.
func (la *Agent) Connector(cat registry.Catalog) *orchestrator.Connector {
	la.mu.Lock()
	defer la.mu.Unlock()
	if la.agent == nil || cat.Version() > la.version {
		tools := agentTools(cat, la.Row.Config.ApprovalPolicy)
		la.agent = orchestrator.NewConnector(profile(la.Row), tools)
		la.version = cat.Version()
		la.emb.fill(la, la.version, tools)
	}
	return la.agent
}

// attach gives the agent of catalog version its tools' embeddings, unless
// a newer catalog replaced it meanwhile.
func (la *Agent) attach(version uint64, byName map[string][]float32) {
	la.mu.Lock()
	defer la.mu.Unlock()
	if la.version == version {
		la.agent = la.agent.WithVectors(byName)
	}
}

func profile(c *store.Connector) orchestrator.Profile {
	return orchestrator.Profile{ID: c.ID, WorkspaceID: c.WorkspaceID, ExternalID: c.ExternalID, Name: c.Name,
		Description: c.Description, Model: c.Config.Model, NarrowAbove: c.Config.NarrowToolsAbove}
}

// agentTools are the enabled tools of cat as the agent offers them, each
// with whether its calls wait for approval under policy. A tool whose
// schema does not read is offered without one.
func agentTools(cat registry.Catalog, policy string) []orchestrator.Tool {
	enabled := cat.Enabled()
	tools := make([]orchestrator.Tool, 0, len(enabled))
	for _, t := range enabled {
		spec, _ := ToolSpec(t)
		tools = append(tools, orchestrator.Tool{Name: t.Name, Description: t.Description, InputSchema: spec.InputSchema,
			Annotations: t.Annotations, RequiresApproval: NeedsApproval(policy, t, cat.Override(t.Name))})
	}
	return tools
}
