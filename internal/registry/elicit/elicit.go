// Package elicit maps MCP elicitation to internal/ask and back: a
// server's elicitation request as the input a user is asked, a user's
// answer as the elicitation result, and a classic server's -32042 (URL
// elicitation required) as the *ask.URLRequiredError callers pause on.
package elicit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/connector-svc/connector-svc/internal/ask"
)

// InputOf is an elicitation request as the user is asked it. Only the
// modes declared (form and URL) are taken.
func InputOf(p mcp.ElicitationParams) (ask.Input, error) {
	in := ask.Input{Mode: p.Mode, Message: p.Message}
	switch p.Mode {
	case "", mcp.ElicitationModeForm:
		in.Mode = ask.ModeForm
		schema, ok := p.RequestedSchema.(map[string]any)
		if p.RequestedSchema != nil && !ok {
			return ask.Input{}, errors.New("invalid elicitation params: requestedSchema is not an object")
		}
		in.Schema = schema
		in.Defaulted = ask.DefaultedFields(schema)
	case mcp.ElicitationModeURL:
		in.Mode = ask.ModeURL
		in.URL, in.ElicitationID = p.URL, p.ElicitationID
		if in.URL == "" {
			return ask.Input{}, errors.New("invalid elicitation params: url is required in url mode")
		}
	default:
		return ask.Input{}, fmt.Errorf("invalid elicitation params: mode %q is not supported (form and url are)", p.Mode)
	}
	return in, nil
}

// Result is the elicitation result that says ans. A URL-mode
// accept carries no content.
func Result(ans ask.Answer) *mcp.ElicitationResult {
	var r mcp.ElicitationResult
	switch ans.Action {
	case ask.Accept:
		r.Action = mcp.ElicitationResponseActionAccept
		if ans.Content != nil {
			r.Content = ans.Content
		}
	case ask.Decline:
		r.Action = mcp.ElicitationResponseActionDecline
	default:
		r.Action = mcp.ElicitationResponseActionCancel
	}
	return &r
}

// NewInputID names an input put to a user: unique within its call's run,
// and across replicas.
func NewInputID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "in_" + hex.EncodeToString(b)
}

// URLRequired turns a classic server's -32042 into the *ask.URLRequiredError
// callers pause on; other errors are returned as they are.
func URLRequired(err error) error {
	var e mcp.URLElicitationRequiredError
	if err == nil || !errors.As(err, &e) {
		return err
	}
	out := &ask.URLRequiredError{}
	for _, p := range e.Elicitations {
		id := p.ElicitationID
		if id == "" {
			id = NewInputID()
		}
		out.Inputs = append(out.Inputs, ask.Input{ID: id, Mode: ask.ModeURL, Message: p.Message, URL: p.URL,
			ElicitationID: p.ElicitationID})
	}
	return out
}
