package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"
)

// catalog is a connector's tool list as the server last listed it, with
// the operators' flags. It is never changed once published: every change
// publishes a new one with a higher version, so a reader holds a
// consistent view without locks, and what is derived from it can be keyed
// by its version (unique in the registry: see Catalog).
type catalog struct {
	version  uint64
	tools    []mcp.Tool     // sorted by name
	byName   map[string]int // index into tools
	hash     string         // of the listed tools; "" forces the next sync
	disabled map[string]bool
	// approval holds the tools whose approval an operator overrode, and
	// how (see ToolChanges.Approval).
	approval map[string]bool
}

// newCatalog indexes tools, as listed by the server; flags come later.
func newCatalog(tools []mcp.Tool) *catalog {
	tools = slices.Clone(tools)
	slices.SortFunc(tools, byName)
	b, _ := json.Marshal(tools)
	sum := sha256.Sum256(b)
	byName := make(map[string]int, len(tools))
	for i, t := range tools {
		byName[t.Name] = i
	}
	return &catalog{tools: tools, byName: byName, hash: string(sum[:])}
}

func byName(a, b mcp.Tool) int { return strings.Compare(a.Name, b.Name) }

// relisted returns a copy of k that holds tools, if a server listed k's
// tools again, the same to the last field; else nil. A health check that
// finds them so has nothing to sync, and knows it without hashing the list
// anew (which costs as much as listing it). The copy holds the new list,
// not k's: the client remembers the new one too, and they share their
// schemas, where keeping k's would hold two copies of each.
func (k *catalog) relisted(tools []mcp.Tool) *catalog {
	if len(tools) != len(k.tools) {
		return nil
	}
	if !slices.IsSortedFunc(tools, byName) {
		tools = slices.SortedFunc(slices.Values(tools), byName)
	}
	for i := range tools {
		if !reflect.DeepEqual(tools[i], k.tools[i]) {
			return nil
		}
	}
	same := *k
	same.tools = tools
	return &same
}

// lookup returns a listed tool.
func (k *catalog) lookup(name string) (mcp.Tool, bool) {
	i, ok := k.byName[name]
	if !ok {
		return mcp.Tool{}, false
	}
	return k.tools[i], true
}

// callable returns a tool that may be called: listed now and enabled.
// Returns ErrToolNotFound or ErrToolDisabled.
func (k *catalog) callable(name string) (mcp.Tool, error) {
	t, ok := k.lookup(name)
	if !ok {
		return mcp.Tool{}, fmt.Errorf("%w: %q is not in the tool list the server gave", ErrToolNotFound, name)
	}
	if k.disabled[name] {
		return mcp.Tool{}, ErrToolDisabled
	}
	return t, nil
}

// withEnabled returns a copy of k with one tool's flag changed.
func (k *catalog) withEnabled(name string, enabled bool) *catalog {
	next := *k
	next.disabled = make(map[string]bool, len(k.disabled)+1)
	for n := range k.disabled {
		next.disabled[n] = true
	}
	if enabled {
		delete(next.disabled, name)
	} else {
		next.disabled[name] = true
	}
	return &next
}

// withApproval returns a copy of k with one tool's approval override
// changed; nil clears it.
func (k *catalog) withApproval(name string, override *bool) *catalog {
	next := *k
	next.approval = maps.Clone(k.approval)
	if next.approval == nil {
		next.approval = map[string]bool{}
	}
	if override == nil {
		delete(next.approval, name)
	} else {
		next.approval[name] = *override
	}
	return &next
}

// sameFlags reports whether k and o carry the same operator flags.
func (k *catalog) sameFlags(o *catalog) bool {
	return maps.Equal(k.disabled, o.disabled) && maps.Equal(k.approval, o.approval)
}

// listTools lists the tools, re-initializing a lost session once.
func (c *conn) listTools(ctx context.Context, s *session, gen uint64) (*mcp.ListToolsResult, error) {
	epoch := c.epoch.Load()
	list, err := s.client.ListTools(ctx, mcp.ListToolsRequest{})
	if isSessionLost(err) && c.canReinitialize() {
		if err = c.reinitialize(s, gen, epoch, trace.LinkFromContext(ctx)); err == nil {
			list, err = s.client.ListTools(ctx, mcp.ListToolsRequest{})
		}
	}
	return list, err
}

// refresh lists the tools now and syncs the catalog. What it reports
// changed is what changed since the catalog it started from, the source's
// diff included: a concurrent sync (a list_changed notification's, a
// health check's) that applied the change first leaves the source's diff
// empty, and the caller who asked is told all the same.
func (c *conn) refresh(ctx context.Context) (ToolChanges, error) {
	s, gen, before, err := c.ready(ctx)
	if err != nil {
		return ToolChanges{}, err
	}
	seq := c.syncSeq.Add(1)
	switch {
	case c.spec.perUser():
		// Its own connection has no user: list over a user's.
		if s = c.anyUserSession(); s == nil {
			return ToolChanges{}, ErrNoUserConnection
		}
		defer s.release()
	case s == nil:
		// A per_session connector keeps no connection of its own: list
		// over a short-lived one.
		if s, _, err = c.openBare(ctx, c.spec, c.hc); err != nil {
			return ToolChanges{}, retryNext(c.redact.err(err))
		}
		defer s.close(c.reg.cfg.CloseGrace)
	}
	list, err := c.listTools(ctx, s, gen)
	if err != nil {
		if ctx.Err() == nil && !IsAuthError(err) && (isConnectionBroken(err) || isSessionLost(err)) {
			c.drop(s, err)
			return ToolChanges{}, c.unavailable(c.redact.err(err))
		}
		return ToolChanges{}, fmt.Errorf("tools/list: %w", c.redact.err(err))
	}
	cat, changes, err := c.syncCatalog(ctx, list.Tools, true)
	c.mu.Lock()
	c.publishCatalog(cat, seq)
	c.mu.Unlock()
	if err == nil && before != nil && cat != nil {
		changes = changes.with(diffTools(before.tools, cat.tools))
	}
	return changes, err
}

// diffTools is what changed from the tools before to those after, both
// sorted by name.
func diffTools(before, after []mcp.Tool) (added, removed, changed []string) {
	i, j := 0, 0
	for i < len(before) || j < len(after) {
		switch {
		case j == len(after) || i < len(before) && before[i].Name < after[j].Name:
			removed = append(removed, before[i].Name)
			i++
		case i == len(before) || after[j].Name < before[i].Name:
			added = append(added, after[j].Name)
			j++
		default:
			if !reflect.DeepEqual(before[i], after[j]) {
				changed = append(changed, after[j].Name)
			}
			i++
			j++
		}
	}
	return added, removed, changed
}

// with is t with the names of added, removed and changed tools it does
// not list yet, each list sorted.
func (t ToolChanges) with(added, removed, changed []string) ToolChanges {
	merge := func(have, more []string) []string {
		for _, n := range more {
			if !slices.Contains(have, n) {
				have = append(have, n)
			}
		}
		slices.Sort(have)
		return have
	}
	t.Added, t.Removed, t.Changed = merge(t.Added, added), merge(t.Removed, removed), merge(t.Changed, changed)
	return t
}

// syncCatalog builds the catalog of the listed tools and, if they changed
// since the last sync (or force), syncs the source and takes the operators'
// flags from it. If the source fails, the last known flags are kept and
// the next check tries again; with none known yet, the stored flags are
// read as a follower reads them, and only if that fails too is the
// catalog nil, the error saying why.
//
// A follower (see SetOwner) writes nothing: see localCatalog.
func (c *conn) syncCatalog(ctx context.Context, tools []mcp.Tool, force bool) (*catalog, ToolChanges, error) {
	c.mu.Lock()
	prev, owner, synced := c.cat, c.owner, c.synced
	c.mu.Unlock()
	if !owner {
		cat, err := c.localCatalog(ctx, prev, tools, force)
		return cat, ToolChanges{}, err
	}
	force = force || !synced
	if prev != nil && prev.hash != "" && !force {
		if same := prev.relisted(tools); same != nil {
			return same, ToolChanges{}, nil
		}
	}
	next := newCatalog(tools)
	if prev != nil && prev.hash == next.hash && !force {
		next.disabled, next.approval = prev.disabled, prev.approval
		c.reg.logger.Debug("tool list unchanged", append(c.logAttrs(), slog.Int("tools", len(next.tools)))...)
		return next, ToolChanges{}, nil
	}
	changes, err := c.reg.source.SyncTools(ctx, c.spec.ID, next.tools)
	if err != nil {
		err = fmt.Errorf("sync tool catalog: %w", err)
		if prev == nil {
			// No flags known yet: take the stored ones, as a follower
			// does, rather than have no catalog; the next check syncs
			// again. An owner whose ownership just moved (its fenced
			// write refused before SetOwner told it) is a follower now.
			cat, ferr := c.localCatalog(ctx, nil, tools, true)
			if ferr != nil {
				return nil, ToolChanges{}, err
			}
			c.reg.logger.Warn("sync tools; using the stored flags until the next sync", append(c.logAttrs(),
				slog.String("error", err.Error()))...)
			return cat, ToolChanges{}, err
		}
		c.reg.logger.Error("sync tools; keeping the last known flags", append(c.logAttrs(), slog.String("error", err.Error()))...)
		next.disabled, next.approval, next.hash = prev.disabled, prev.approval, ""
		return next, ToolChanges{}, err
	}
	next.disabled = make(map[string]bool, len(changes.Disabled))
	for _, name := range changes.Disabled {
		next.disabled[name] = true
	}
	next.approval = changes.Approval
	c.mu.Lock()
	c.synced = c.owner
	c.mu.Unlock()
	c.logChanges(changes)
	return next, changes, nil
}

// localCatalog builds the catalog of the listed tools for a follower,
// which writes nothing: if they changed since prev (or force), the flags
// are read from the source, and a listed tool the source does not know
// yet is as the owner's sync will make it: enabled, unless the connector's
// new tools start disabled.
// If the source fails, the last known flags are kept; with none known yet,
// the catalog is nil and the error says why.
func (c *conn) localCatalog(ctx context.Context, prev *catalog, tools []mcp.Tool, force bool) (*catalog, error) {
	if prev != nil && prev.hash != "" && !force {
		if same := prev.relisted(tools); same != nil {
			return same, nil
		}
	}
	next := newCatalog(tools)
	if prev != nil && prev.hash == next.hash && !force {
		next.disabled, next.approval = prev.disabled, prev.approval
		return next, nil
	}
	flags, err := c.reg.source.ToolFlags(ctx, c.spec.ID)
	if err != nil {
		err = fmt.Errorf("read tool flags: %w", err)
		if prev == nil {
			return nil, err
		}
		c.reg.logger.Error("read tool flags; keeping the last known ones", append(c.logAttrs(), slog.String("error", err.Error()))...)
		next.disabled, next.approval, next.hash = prev.disabled, prev.approval, ""
		return next, err
	}
	next.disabled = map[string]bool{}
	for _, t := range next.tools {
		if enabled, known := flags.Enabled[t.Name]; known && !enabled || !known && flags.DisableNew {
			next.disabled[t.Name] = true
		}
	}
	next.approval = flags.Approval
	c.mu.Lock()
	c.synced = false
	c.mu.Unlock()
	c.reg.logger.Debug("tool catalog listed; the owner syncs it", append(c.logAttrs(), slog.Int("tools", len(next.tools)))...)
	return next, nil
}

// resync lists the tools once and publishes the catalog with the flags
// read from the source, writing nothing (see Registry.Resync).
func (c *conn) resync(ctx context.Context) error {
	s, gen, _, err := c.ready(ctx)
	if err != nil {
		return err
	}
	seq := c.syncSeq.Add(1)
	switch {
	case c.spec.perUser():
		// Nothing to list over but a user's connection; with none open,
		// the next one to open lists.
		if s = c.anyUserSession(); s == nil {
			return nil
		}
		defer s.release()
	case s == nil:
		// A per_session connector keeps no connection of its own.
		if s, _, err = c.openBare(ctx, c.spec, c.hc); err != nil {
			return retryNext(c.redact.err(err))
		}
		defer s.close(c.reg.cfg.CloseGrace)
	}
	list, err := c.listTools(ctx, s, gen)
	if err != nil {
		if ctx.Err() == nil && !IsAuthError(err) && (isConnectionBroken(err) || isSessionLost(err)) {
			c.drop(s, err)
			return c.unavailable(c.redact.err(err))
		}
		return fmt.Errorf("tools/list: %w", c.redact.err(err))
	}
	c.mu.Lock()
	prev := c.cat
	c.mu.Unlock()
	cat, err := c.localCatalog(ctx, prev, list.Tools, true)
	c.mu.Lock()
	c.publishCatalog(cat, seq)
	c.mu.Unlock()
	return err
}

// publishCatalog makes next the current catalog, unless a sync that
// started later has published already. c.mu must be held.
func (c *conn) publishCatalog(next *catalog, seq uint64) {
	if next == nil || seq < c.catSeq {
		return
	}
	c.catSeq = seq
	if c.cat != nil && next.hash == c.cat.hash && next.sameFlags(c.cat) {
		// Nothing new: keep the version, but hold the list just listed,
		// whose schemas the client shares, and let the old one go.
		next.version = c.cat.version
		c.cat = next
		return
	}
	next.version = c.reg.catVersions.Add(1)
	c.cat = next
}

// setFlag publishes an operator's change of a tool's flags, made by with.
func (c *conn) setFlag(with func(*catalog) *catalog) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cat == nil {
		return // the first sync reads the flags from the source
	}
	next := with(c.cat)
	next.version = c.reg.catVersions.Add(1)
	c.cat = next
	// A sync that started before this change read the old flag: it must
	// not publish over it.
	c.catSeq = c.syncSeq.Add(1)
}

// tools returns the current catalog's tools, sorted by name.
func (c *conn) tools() []mcp.Tool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cat == nil {
		return nil
	}
	return c.cat.tools
}

// logChanges logs what a sync changed.
func (c *conn) logChanges(changes ToolChanges) {
	if changes.Empty() {
		c.reg.logger.Debug("tool catalog synced; no tool added, removed or changed", append(c.logAttrs(),
			slog.Any("disabled", changes.Disabled))...)
	} else {
		c.reg.logger.Info("tool catalog synced", append(c.logAttrs(), slog.Any("added", changes.Added),
			slog.Any("removed", changes.Removed), slog.Any("changed", changes.Changed))...)
	}
}
