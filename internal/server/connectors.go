package server

import (
	"context"
	"slices"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/connectors"
	"github.com/connector-svc/connector-svc/internal/store"
)

const (
	defaultConnectorPageSize = 50
	defaultToolPageSize      = 100
	maxPageSize              = 1000
)

// CreateConnector implements connector.v1.ConnectorService.
func (s *Server) CreateConnector(ctx context.Context, req *connectorv1.CreateConnectorRequest) (*connectorv1.CreateConnectorResponse, error) {
	n, err := newConnector(req)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.connectors.Create(ctx, n)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.CreateConnectorResponse{Connector: s.render(c)}, nil
}

// newConnector checks a create request's own fields and returns its
// connector for the use case, which checks the connector. A request that
// breaks both kinds of rules is told of all of them at once.
func newConnector(req *connectorv1.CreateConnectorRequest) (connectors.NewConnector, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	p := req.GetConnector()
	if p == nil {
		c.add("connector", "required")
		return connectors.NewConnector{}, c.err()
	}
	if p.WorkspaceId != "" && p.WorkspaceId != req.GetWorkspaceId() {
		c.add("connector.workspace_id", "must be empty or equal to workspace_id")
	}
	sp := specFromProto(p)
	if len(c.violations) > 0 {
		c.use(connectors.CheckNew(sp))
		return connectors.NewConnector{}, c.err()
	}
	return connectors.NewConnector{WorkspaceID: req.GetWorkspaceId(), Spec: sp, Active: req.Active == nil || *req.Active}, nil
}

// GetConnector implements connector.v1.ConnectorService.
func (s *Server) GetConnector(ctx context.Context, req *connectorv1.GetConnectorRequest) (*connectorv1.GetConnectorResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.db.GetConnector(ctx, req.GetWorkspaceId(), req.GetConnectorId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.GetConnectorResponse{Connector: s.render(c)}, nil
}

// ListConnectors implements connector.v1.ConnectorService.
func (s *Server) ListConnectors(ctx context.Context, req *connectorv1.ListConnectorsRequest) (*connectorv1.ListConnectorsResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultConnectorPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	cs, err := s.db.ListConnectors(ctx, req.GetWorkspaceId(), after, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &connectorv1.ListConnectorsResponse{}
	cs, resp.NextPageToken = nextPage(cs, size, func(c *store.Connector) string { return c.ExternalID })
	for _, c := range cs {
		resp.Connectors = append(resp.Connectors, s.render(c))
	}
	return resp, nil
}

// UpdateConnector implements connector.v1.ConnectorService. The stored
// connector and the request are merged along update_mask and the result is
// validated as a whole (connectors.Service.Update); nothing is written if
// it is invalid.
func (s *Server) UpdateConnector(ctx context.Context, req *connectorv1.UpdateConnectorRequest) (*connectorv1.UpdateConnectorResponse, error) {
	var c checker
	c.id("workspace_id", req.GetWorkspaceId())
	c.id("connector.connector_id", req.GetConnector().GetConnectorId())
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		c.add("update_mask", `required: name the fields to change, e.g. {"paths": ["name"]}`)
	}
	for _, path := range paths {
		if !slices.Contains(connectors.UpdatePaths, path) {
			c.add("update_mask", "unknown or immutable path %q; allowed: %v", path, connectors.UpdatePaths)
		}
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	updated, err := s.connectors.Update(ctx, connectors.Update{WorkspaceID: req.GetWorkspaceId(),
		ConnectorID: req.GetConnector().GetConnectorId(), Spec: specFromProto(req.GetConnector()), Paths: paths})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.UpdateConnectorResponse{Connector: s.render(updated)}, nil
}

// DeleteConnector implements connector.v1.ConnectorService.
func (s *Server) DeleteConnector(ctx context.Context, req *connectorv1.DeleteConnectorRequest) (*connectorv1.DeleteConnectorResponse, error) {
	if err := connectorRef(req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if err := s.connectors.Delete(ctx, req.GetWorkspaceId(), req.GetConnectorId()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &connectorv1.DeleteConnectorResponse{}, nil
}

// ActivateConnector implements connector.v1.ConnectorService.
func (s *Server) ActivateConnector(ctx context.Context, req *connectorv1.ActivateConnectorRequest) (*connectorv1.ActivateConnectorResponse, error) {
	c, err := s.setActive(ctx, req.GetWorkspaceId(), req.GetConnectorId(), true)
	if err != nil {
		return nil, err
	}
	return &connectorv1.ActivateConnectorResponse{Connector: c}, nil
}

// DeactivateConnector implements connector.v1.ConnectorService.
func (s *Server) DeactivateConnector(ctx context.Context, req *connectorv1.DeactivateConnectorRequest) (*connectorv1.DeactivateConnectorResponse, error) {
	c, err := s.setActive(ctx, req.GetWorkspaceId(), req.GetConnectorId(), false)
	if err != nil {
		return nil, err
	}
	return &connectorv1.DeactivateConnectorResponse{Connector: c}, nil
}

// setActive sets the desired state; its errors are already statuses.
func (s *Server) setActive(ctx context.Context, workspaceID, connectorID string, active bool) (*connectorv1.Connector, error) {
	if err := connectorRef(workspaceID, connectorID); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.connectors.SetActive(ctx, workspaceID, connectorID, active)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return s.render(c), nil
}

// render is a connector for a response, with the registry's live health
// when this replica owns the connector, and the sessions it has open.
// The counters include the query counts not written to the store yet.
func (s *Server) render(c *store.Connector) *connectorv1.Connector {
	if d := s.counts.Unwritten(c.ID); d != (store.Counters{}) {
		withCounts := *c
		withCounts.Counters = s.counts.With(c.ID, c.Counters)
		c = &withCounts
	}
	p := connectorToProto(c)
	// The owner's health is live; another replica's is what the owner
	// last wrote, in the row.
	if h, err := s.reg.Health(c.ID); err == nil && c.Active && s.reg.Owner(c.ID) {
		p.Health = liveHealthToProto(h)
	}
	if c.Active {
		p.OpenSessions = int32(s.reg.SessionCount(c.ID))
	}
	return p
}
