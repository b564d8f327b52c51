package server

import (
	"context"
	"encoding/base64"
	"errors"

	"github.com/mark3labs/mcp-go/mcp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/resources"
)

// Resources, templates, prompts and completions: each request is placed
// as a tool call of the same caller is (the owner of a stdio connector,
// the replica holding the caller's session or user), then served by
// resources.Service.

// contentRequest is what the resource and prompt requests share.
type contentRequest interface {
	callerRequest
}

// checkContentRequest validates a request's ids.
func checkContentRequest(c *checker, req contentRequest) {
	c.ref(req.GetWorkspaceId(), req.GetConnectorId())
	c.sessionID(req.GetSessionId())
}

func contentTarget(req contentRequest) resources.Target {
	return resources.Target{WorkspaceID: req.GetWorkspaceId(), ConnectorID: req.GetConnectorId(),
		SessionID: req.GetSessionId(), UserID: req.GetUserId()}
}

// contentError maps the use case's errors that need the request (a user
// who must authorize first, a field refused) before toStatus.
func (s *Server) contentError(ctx context.Context, err error) error {
	var auth *calls.AuthorizationRequiredError
	if errors.As(err, &auth) {
		return s.toStatus(ctx, s.authorizationNeeded(ctx, auth.Row, auth.UserID, auth.Required, ""))
	}
	var inv *resources.InvalidError
	if errors.As(err, &inv) {
		var c checker
		c.add(inv.Field, "%s", inv.Reason)
		return s.toStatus(ctx, c.err())
	}
	return s.toStatus(ctx, err)
}

// ListResources implements connector.v1.ConnectorService.
func (s *Server) ListResources(ctx context.Context, req *connectorv1.ListResourcesRequest) (*connectorv1.ListResourcesResponse, error) {
	var c checker
	checkContentRequest(&c, req)
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultToolPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.ListResources); done {
		return resp, err
	}
	k, err := s.resources.Resources(ctx, contentTarget(req), req.GetRefresh())
	if err != nil {
		return nil, s.contentError(ctx, err)
	}
	items, next := pageAfter(k.Resources, func(r mcp.Resource) string { return r.URI }, after, size)
	resp := &connectorv1.ListResourcesResponse{NextPageToken: next, SubscribeSupported: k.Caps.Subscribe,
		ListedAt: timestamppb.New(k.ListedAt)}
	for _, r := range items {
		p := &connectorv1.Resource{Uri: r.URI, Name: r.Name, Description: r.Description, MimeType: r.MIMEType}
		p.Title = r.Title
		if r.Size != nil {
			p.Size = int64(*r.Size)
		}
		resp.Resources = append(resp.Resources, p)
	}
	return resp, nil
}

// ListResourceTemplates implements connector.v1.ConnectorService.
func (s *Server) ListResourceTemplates(ctx context.Context, req *connectorv1.ListResourceTemplatesRequest) (*connectorv1.ListResourceTemplatesResponse, error) {
	var c checker
	checkContentRequest(&c, req)
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultToolPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.ListResourceTemplates); done {
		return resp, err
	}
	k, err := s.resources.Resources(ctx, contentTarget(req), req.GetRefresh())
	if err != nil {
		return nil, s.contentError(ctx, err)
	}
	key := func(t mcp.ResourceTemplate) string { return templateURI(t) }
	items, next := pageAfter(k.Templates, key, after, size)
	resp := &connectorv1.ListResourceTemplatesResponse{NextPageToken: next}
	for _, t := range items {
		p := &connectorv1.ResourceTemplate{UriTemplate: templateURI(t), Name: t.Name, Description: t.Description, MimeType: t.MIMEType}
		p.Title = t.Title
		resp.ResourceTemplates = append(resp.ResourceTemplates, p)
	}
	return resp, nil
}

// templateURI is a template's URI template as the server gave it.
func templateURI(t mcp.ResourceTemplate) string {
	if t.URITemplate == nil || t.URITemplate.Template == nil {
		return ""
	}
	return t.URITemplate.Raw()
}

// ReadResource implements connector.v1.ConnectorService.
func (s *Server) ReadResource(ctx context.Context, req *connectorv1.ReadResourceRequest) (*connectorv1.ReadResourceResponse, error) {
	var c checker
	checkContentRequest(&c, req)
	if err := resources.CheckURI("uri", req.GetUri()); err != nil {
		var inv *resources.InvalidError
		errors.As(err, &inv)
		c.add(inv.Field, "%s", inv.Reason)
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.ReadResource); done {
		return resp, err
	}
	res, err := s.resources.Read(ctx, contentTarget(req), req.GetUri())
	if err != nil {
		return nil, s.contentError(ctx, err)
	}
	resp := &connectorv1.ReadResourceResponse{SizeBytes: int64(res.Bytes), Duration: durationpb.New(res.Duration)}
	for _, rc := range res.Contents {
		if p := resourceContentsToProto(rc); p != nil {
			resp.Contents = append(resp.Contents, p)
		}
	}
	return resp, nil
}

// resourceContentsToProto converts one part of a read: binary data
// decoded to bytes.
func resourceContentsToProto(rc mcp.ResourceContents) *connectorv1.ResourceContents {
	switch rc := rc.(type) {
	case mcp.TextResourceContents:
		return &connectorv1.ResourceContents{Uri: rc.URI, MimeType: rc.MIMEType, Data: &connectorv1.ResourceContents_Text{Text: rc.Text}}
	case mcp.BlobResourceContents:
		b, _ := base64.StdEncoding.DecodeString(rc.Blob)
		return &connectorv1.ResourceContents{Uri: rc.URI, MimeType: rc.MIMEType, Data: &connectorv1.ResourceContents_Blob{Blob: b}}
	}
	return nil
}

// ListPrompts implements connector.v1.ConnectorService.
func (s *Server) ListPrompts(ctx context.Context, req *connectorv1.ListPromptsRequest) (*connectorv1.ListPromptsResponse, error) {
	var c checker
	checkContentRequest(&c, req)
	size, after := c.page(req.GetPageSize(), req.GetPageToken(), defaultToolPageSize)
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.ListPrompts); done {
		return resp, err
	}
	k, err := s.resources.Prompts(ctx, contentTarget(req), req.GetRefresh())
	if err != nil {
		return nil, s.contentError(ctx, err)
	}
	items, next := pageAfter(k.Prompts, func(p mcp.Prompt) string { return p.Name }, after, size)
	resp := &connectorv1.ListPromptsResponse{NextPageToken: next}
	for _, p := range items {
		pp := &connectorv1.Prompt{Name: p.Name, Title: p.Title, Description: p.Description}
		for _, a := range p.Arguments {
			pp.Arguments = append(pp.Arguments, &connectorv1.PromptArgument{Name: a.Name, Description: a.Description, Required: a.Required})
		}
		resp.Prompts = append(resp.Prompts, pp)
	}
	return resp, nil
}

// GetPrompt implements connector.v1.ConnectorService.
func (s *Server) GetPrompt(ctx context.Context, req *connectorv1.GetPromptRequest) (*connectorv1.GetPromptResponse, error) {
	var c checker
	checkContentRequest(&c, req)
	if req.GetName() == "" {
		c.add("name", "is required: a prompt's name, as ListPrompts lists them")
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.GetPrompt); done {
		return resp, err
	}
	res, err := s.resources.GetPrompt(ctx, contentTarget(req), req.GetName(), req.GetArguments())
	if err != nil {
		return nil, s.contentError(ctx, err)
	}
	resp := &connectorv1.GetPromptResponse{Description: res.Description}
	for _, m := range res.Messages {
		resp.Messages = append(resp.Messages, &connectorv1.PromptMessage{Role: string(m.Role), Content: contentToProto(m.Content)})
	}
	return resp, nil
}

// Complete implements connector.v1.ConnectorService.
func (s *Server) Complete(ctx context.Context, req *connectorv1.CompleteRequest) (*connectorv1.CompleteResponse, error) {
	var c checker
	checkContentRequest(&c, req)
	switch {
	case req.GetPromptName() == "" && req.GetResourceTemplateUri() == "":
		c.add("prompt_name", "set prompt_name or resource_template_uri: what the argument belongs to")
	case req.GetPromptName() != "" && req.GetResourceTemplateUri() != "":
		c.add("resource_template_uri", "set prompt_name or resource_template_uri, not both")
	}
	if req.GetArgumentName() == "" {
		c.add("argument_name", "is required")
	}
	if err := c.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if resp, done, err := forwardUnary(ctx, s, s.toCaller(req), req, connectorv1.ConnectorServiceClient.Complete); done {
		return resp, err
	}
	res, err := s.resources.Complete(ctx, contentTarget(req), registry.CompleteRequest{Prompt: req.GetPromptName(),
		TemplateURI: req.GetResourceTemplateUri(), Argument: req.GetArgumentName(), Value: req.GetValue(),
		Context: req.GetContextArguments()})
	if err != nil {
		return nil, s.contentError(ctx, err)
	}
	resp := &connectorv1.CompleteResponse{Values: res.Completion.Values, Total: int32(res.Completion.Total),
		HasMore: res.Completion.HasMore}
	if len(resp.Values) > maxCompletions {
		resp.Values, resp.HasMore = resp.Values[:maxCompletions], true
	}
	return resp, nil
}

// maxCompletions is the most values MCP lets a completion carry.
const maxCompletions = 100

// pageAfter is a page of a cached list, by key: the items after the key
// a page token carries, and the next page's token.
func pageAfter[T any](items []T, key func(T) string, after string, size int) ([]T, string) {
	page, _ := resources.Page(items, key, after, size+1)
	return nextPage(page, size, key)
}
