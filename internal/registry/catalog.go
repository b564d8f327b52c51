package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
)

// listTools lists the tools, re-initializing a lost session once.
func (c *conn) listTools(ctx context.Context, s *session, gen uint64) (*mcp.ListToolsResult, error) {
	epoch := c.epoch.Load()
	list, err := s.client.ListTools(ctx, mcp.ListToolsRequest{})
	if isSessionLost(err) && c.canReinitialize() {
		if err = c.reinitialize(s, gen, epoch); err == nil {
			list, err = s.client.ListTools(ctx, mcp.ListToolsRequest{})
		}
	}
	return list, err
}

// refresh lists the tools now and syncs the catalog.
func (c *conn) refresh(ctx context.Context) (ToolChanges, error) {
	s, gen, err := c.current(ctx)
	if err != nil {
		return ToolChanges{}, err
	}
	list, err := c.listTools(ctx, s, gen)
	if err != nil {
		if isConnectionBroken(err) || isSessionLost(err) {
			c.fail(err)
			return ToolChanges{}, unavailable(err)
		}
		return ToolChanges{}, fmt.Errorf("tools/list: %w", err)
	}
	return c.syncTools(ctx, list.Tools, true)
}

// setTools records the server's tool list and syncs the catalog if it
// changed since the last sync.
func (c *conn) setTools(ctx context.Context, tools []mcp.Tool) {
	if _, err := c.syncTools(ctx, tools, false); err != nil {
		c.reg.logger.Error("sync tools", append(c.logAttrs(), slog.String("error", err.Error()))...)
	}
}

func (c *conn) syncTools(ctx context.Context, tools []mcp.Tool, force bool) (ToolChanges, error) {
	tools = slices.Clone(tools)
	slices.SortFunc(tools, func(a, b mcp.Tool) int { return strings.Compare(a.Name, b.Name) })
	b, _ := json.Marshal(tools)
	sum := sha256.Sum256(b)
	hash := string(sum[:])
	byName := make(map[string]int, len(tools))
	for i, t := range tools {
		byName[t.Name] = i
	}
	c.mu.Lock()
	changed := hash != c.toolsHash
	c.tools, c.toolByName, c.toolsHash = tools, byName, hash
	c.mu.Unlock()
	if !changed && !force {
		return ToolChanges{}, nil
	}
	changes, err := c.reg.source.SyncTools(ctx, c.spec.ID, tools)
	if err != nil {
		c.mu.Lock()
		c.toolsHash = "" // try again next time
		c.mu.Unlock()
		return ToolChanges{}, err
	}
	disabled := make(map[string]bool, len(changes.Disabled))
	for _, name := range changes.Disabled {
		disabled[name] = true
	}
	c.mu.Lock()
	c.disabled = disabled
	c.mu.Unlock()
	if !changes.Empty() {
		c.reg.logger.Info("tool catalog synced", append(c.logAttrs(), slog.Any("added", changes.Added),
			slog.Any("removed", changes.Removed), slog.Any("changed", changes.Changed))...)
	}
	return changes, nil
}

// tool returns the cached definition of a tool.
func (c *conn) tool(name string) (mcp.Tool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.toolByName[name]
	if !ok {
		return mcp.Tool{}, false
	}
	return c.tools[i], true
}
