// Package resources is the use case of what a connector's server offers
// beside tools, whatever the front door (the gRPC API, the MCP endpoint,
// the agent): its resources and resource templates, listed from the
// registry's cache and read on demand; its prompts, listed and got with
// arguments; and completions of prompts' and templates' arguments. A
// connector whose server offers none of a kind says so (ErrNoResources,
// ErrNoPrompts, ErrNoCompletions) instead of answering an empty list.
//
// As for tool calls, where a request runs (here, or on the replica that
// owns a stdio connector or holds the caller's session) is live.Placer's
// to say before a front door calls in here, and the caller's session and
// user ids come checked. What is read is capped as tool results are (the
// registry stops reading an answer over its message limit; a read over
// MAX_TOOL_RESULT_BYTES is refused whole), with the same errors.
package resources

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/calls"
	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/registry"
	"github.com/connector-svc/connector-svc/internal/store"
)

// Errors a front door maps.
var (
	// ErrNoResources, ErrNoPrompts and ErrNoCompletions: the server does
	// not offer the kind (it did not declare the capability).
	ErrNoResources   = registry.ErrNoResources
	ErrNoPrompts     = registry.ErrNoPrompts
	ErrNoCompletions = registry.ErrNoCompletions
)

// InvalidError is a request this package refuses before it reaches the
// server; Field names the request's field.
type InvalidError struct{ Field, Reason string }

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// UnknownPromptError: the server does not list the prompt.
type UnknownPromptError struct{ Name string }

func (e *UnknownPromptError) Error() string {
	return fmt.Sprintf("prompt %q is not in the prompt list the server gave; ListPrompts lists them", e.Name)
}

// MissingArgumentsError: a prompt's required arguments were not given.
type MissingArgumentsError struct {
	Prompt  string
	Missing []string
}

func (e *MissingArgumentsError) Error() string {
	return fmt.Sprintf("prompt %q needs the argument(s) %s", e.Prompt, strings.Join(e.Missing, ", "))
}

// ServerError is the server's own refusal of a read, a prompt or a
// completion (a JSON-RPC error: an unknown URI, say), its message as the
// server gave it.
type ServerError struct{ Err error }

func (e *ServerError) Error() string { return "the server refused: " + e.Err.Error() }
func (e *ServerError) Unwrap() error { return e.Err }

// Deps are a Service's collaborators.
type Deps struct {
	Registry *registry.Registry
	// Calls finds the connector (active, held here) as a tool call does.
	Calls *calls.Service
	// MaxResultBytes caps what one read or prompt returns; 0 or less is
	// no cap (the registry's own limit still holds).
	MaxResultBytes int
}

// Service serves connectors' resources, prompts and completions. Safe for
// concurrent use.
type Service struct{ d Deps }

// New returns a Service over d.
func New(d Deps) *Service { return &Service{d: d} }

// Target names a connector and, for those that keep connections per
// caller session or per end user, whose connection to use.
type Target struct {
	WorkspaceID, ConnectorID string
	SessionID, UserID        string
}

// Contents returns the connector's resources, templates and prompts as
// last listed (listed now if fresh, or never listed).
func (s *Service) Contents(ctx context.Context, t Target, fresh bool) (_ *registry.Contents, err error) {
	id, row, err := s.connector(ctx, t)
	if err != nil {
		return nil, err
	}
	defer s.authorization(row, t, &err)
	return s.d.Registry.Contents(ctx, id, fresh)
}

// Resources returns the listed resources, or ErrNoResources.
func (s *Service) Resources(ctx context.Context, t Target, fresh bool) (*registry.Contents, error) {
	k, err := s.Contents(ctx, t, fresh)
	if err == nil && !k.Caps.Resources {
		return nil, ErrNoResources
	}
	return k, err
}

// Prompts returns the listed prompts, or ErrNoPrompts.
func (s *Service) Prompts(ctx context.Context, t Target, fresh bool) (*registry.Contents, error) {
	k, err := s.Contents(ctx, t, fresh)
	if err == nil && !k.Caps.Prompts {
		return nil, ErrNoPrompts
	}
	return k, err
}

// ReadResult is a resource read.
type ReadResult struct {
	Contents []mcp.ResourceContents
	// Bytes is the size of its text and decoded binary data.
	Bytes    int
	Duration time.Duration
}

// MaxURIBytes bounds a resource URI.
const MaxURIBytes = 8 << 10

// CheckURI refuses what cannot be a resource URI: empty, too long, not
// UTF-8, or without a scheme.
func CheckURI(field, uri string) error {
	switch {
	case uri == "":
		return &InvalidError{Field: field, Reason: "is required"}
	case len(uri) > MaxURIBytes:
		return &InvalidError{Field: field, Reason: fmt.Sprintf("is %d bytes, over %d", len(uri), MaxURIBytes)}
	case !utf8.ValidString(uri):
		return &InvalidError{Field: field, Reason: "is not valid UTF-8"}
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme == "" {
		return &InvalidError{Field: field, Reason: fmt.Sprintf("%q is not a URI with a scheme (file:///path, https://…, a server's own scheme://…)", uri)}
	}
	return nil
}

// Read reads one resource of the connector over the caller's connection.
// A read over the registry's message limit is refused as it is read, one
// over MaxResultBytes once read: *calls.ResultTooLargeError either way.
func (s *Service) Read(ctx context.Context, t Target, uri string) (_ *ReadResult, err error) {
	if err := CheckURI("uri", uri); err != nil {
		return nil, err
	}
	id, row, err := s.connector(ctx, t)
	if err != nil {
		return nil, err
	}
	defer s.authorization(row, t, &err)
	start := time.Now()
	res, err := s.d.Registry.ReadResource(ctx, id, uri, s.options(row, t))
	if err != nil {
		return nil, s.serverError(err, "resource")
	}
	n := ContentsSize(res.Contents)
	if err := s.checkSize(n, "resource"); err != nil {
		return nil, err
	}
	return &ReadResult{Contents: res.Contents, Bytes: n, Duration: time.Since(start)}, nil
}

// GetPrompt gets a prompt with its arguments. A prompt the server does
// not list, or one missing a required argument, is refused before it is
// sent.
func (s *Service) GetPrompt(ctx context.Context, t Target, name string, args map[string]string) (_ *mcp.GetPromptResult, err error) {
	if name == "" {
		return nil, &InvalidError{Field: "name", Reason: "is required"}
	}
	k, err := s.Prompts(ctx, t, false)
	if err != nil {
		return nil, err
	}
	p, ok := k.Prompt(name)
	if !ok {
		// Listed again once: the server may have added it since.
		if k, err = s.Prompts(ctx, t, true); err != nil {
			return nil, err
		}
		if p, ok = k.Prompt(name); !ok {
			return nil, &UnknownPromptError{Name: name}
		}
	}
	var missing []string
	for _, a := range p.Arguments {
		if _, given := args[a.Name]; a.Required && !given {
			missing = append(missing, a.Name)
		}
	}
	if len(missing) > 0 {
		return nil, &MissingArgumentsError{Prompt: name, Missing: missing}
	}
	id, row, err := s.connector(ctx, t)
	if err != nil {
		return nil, err
	}
	defer s.authorization(row, t, &err)
	res, err := s.d.Registry.GetPrompt(ctx, id, name, args, s.options(row, t))
	if err != nil {
		return nil, s.serverError(err, "prompt")
	}
	n := 0
	for _, m := range res.Messages {
		n += contentSize(m.Content)
	}
	if err := s.checkSize(n, "prompt"); err != nil {
		return nil, err
	}
	return res, nil
}

// Complete asks the server for completions of a prompt's or a resource
// template's argument.
func (s *Service) Complete(ctx context.Context, t Target, req registry.CompleteRequest) (_ *mcp.CompleteResult, err error) {
	switch {
	case req.Prompt == "" && req.TemplateURI == "":
		return nil, &InvalidError{Field: "ref", Reason: "name a prompt (prompt_name) or a resource template (resource_template_uri)"}
	case req.Prompt != "" && req.TemplateURI != "":
		return nil, &InvalidError{Field: "ref", Reason: "name a prompt or a resource template, not both"}
	case req.Argument == "":
		return nil, &InvalidError{Field: "argument_name", Reason: "is required"}
	}
	id, row, err := s.connector(ctx, t)
	if err != nil {
		return nil, err
	}
	defer s.authorization(row, t, &err)
	res, err := s.d.Registry.Complete(ctx, id, req, s.options(row, t))
	if err != nil {
		return nil, s.serverError(err, "completion")
	}
	return res, nil
}

// connector finds the connector as a tool call does: active, and held
// here.
func (s *Service) connector(ctx context.Context, t Target) (int64, *store.Connector, error) {
	id, err := s.d.Calls.Callable(ctx, t.WorkspaceID, t.ConnectorID)
	if err != nil {
		return 0, nil, err
	}
	row, err := s.d.Calls.LiveRow(ctx, id, t.WorkspaceID, t.ConnectorID)
	if err != nil {
		return 0, nil, err
	}
	return id, row, nil
}

// options are the registry's call options for t on row's connector.
func (s *Service) options(row *store.Connector, t Target) registry.CallOptions {
	opts := registry.CallOptions{Session: t.SessionID}
	if row.Config.AuthMode() == store.AuthUser {
		opts.UserID = t.UserID
	}
	return opts
}

// authorization turns a missing user token into the error a tool call
// gives, which front doors answer with where to authorize.
func (s *Service) authorization(row *store.Connector, t Target, err *error) {
	var required *oauth.RequiredError
	if *err != nil && errors.As(*err, &required) {
		user := ""
		if row.Config.AuthMode() == store.AuthUser {
			user = t.UserID
		}
		*err = &calls.AuthorizationRequiredError{Row: row, UserID: user, Required: required}
	}
}

// serverError maps the registry's errors: an answer over its limit, and
// the server's own refusals.
func (s *Service) serverError(err error, what string) error {
	if errors.Is(err, registry.ErrResultTooLarge) {
		return &calls.ResultTooLargeError{Limit: s.d.MaxResultBytes, What: what}
	}
	for _, e := range []error{mcp.ErrMethodNotFound, mcp.ErrInvalidParams, mcp.ErrInvalidRequest,
		mcp.ErrResourceNotFound, mcp.ErrInternalError} {
		if errors.Is(err, e) {
			return &ServerError{Err: err} // the server's JSON-RPC error answer
		}
	}
	return err
}

func (s *Service) checkSize(n int, what string) error {
	if limit := s.d.MaxResultBytes; limit > 0 && n > limit {
		return &calls.ResultTooLargeError{Size: n, Limit: limit, What: what}
	}
	return nil
}

// ContentsSize is the size of resource contents' text and decoded
// binary data.
func ContentsSize(cs []mcp.ResourceContents) int {
	n := 0
	for _, c := range cs {
		switch c := c.(type) {
		case mcp.TextResourceContents:
			n += len(c.Text)
		case mcp.BlobResourceContents:
			n += decodedSize(c.Blob)
		}
	}
	return n
}

// decodedSize is the size of standard base64 data once decoded.
func decodedSize(b64 string) int {
	n := base64.StdEncoding.DecodedLen(len(b64))
	return n - (len(b64) - len(strings.TrimRight(b64, "=")))
}

func contentSize(c mcp.Content) int {
	switch c := c.(type) {
	case mcp.TextContent:
		return len(c.Text)
	case mcp.ImageContent:
		return decodedSize(c.Data)
	case mcp.AudioContent:
		return decodedSize(c.Data)
	case mcp.EmbeddedResource:
		return ContentsSize([]mcp.ResourceContents{c.Resource})
	}
	return 0
}

// Page returns the page of items after token (the last key of the page
// before, "" for the first), at most size, by key; and the next token, ""
// at the end. Lists are the server's as cached: a page is stable while
// the list is.
func Page[T any](items []T, key func(T) string, token string, size int) ([]T, string) {
	sorted := slices.SortedFunc(slices.Values(items), func(a, b T) int { return strings.Compare(key(a), key(b)) })
	start := 0
	if token != "" {
		start, _ = slices.BinarySearchFunc(sorted, token, func(a T, k string) int { return strings.Compare(key(a), k) })
		for start < len(sorted) && key(sorted[start]) <= token {
			start++
		}
	}
	end := min(start+size, len(sorted))
	if end >= len(sorted) {
		return sorted[start:], ""
	}
	return sorted[start:end], key(sorted[end-1])
}
