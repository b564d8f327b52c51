package console

import (
	"context"
	"encoding/json"
	"html/template"
	"net/http"

	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/console/schemaform"
)

// listTools reads a connector's whole catalog.
func (h *Handler) listTools(ctx context.Context, s *session, id string) ([]*connectorv1.Tool, error) {
	return all(func(token string) ([]*connectorv1.Tool, string, error) {
		resp, err := h.api.ListTools(outgoing(ctx, s), &connectorv1.ListToolsRequest{WorkspaceId: s.key.WorkspaceID,
			ConnectorId: id, PageSize: 1000, PageToken: token})
		return resp.GetTools(), resp.GetNextPageToken(), err
	})
}

// findTool returns a connector's tool by name, or a NOT_FOUND page's
// message.
func (h *Handler) findTool(ctx context.Context, s *session, id, name string) (*connectorv1.Tool, error) {
	tools, err := h.listTools(ctx, s, id)
	if err != nil {
		return nil, err
	}
	for _, t := range tools {
		if t.GetName() == name {
			return t, nil
		}
	}
	return nil, nil
}

// schemaOf is a tool's input schema as JSON.
func schemaOf(t *connectorv1.Tool) []byte {
	if t.GetInputSchema() == nil {
		return nil
	}
	b, _ := json.Marshal(t.GetInputSchema().AsMap())
	return b
}

type toolData struct {
	ConnectorID string
	T           *connectorv1.Tool
	Schema      string
	Form        template.HTML
	Result      *connectorv1.CallToolResponse
	Error       string
}

func (h *Handler) toolPage(w http.ResponseWriter, r *http.Request, s *session) {
	h.showTool(w, r, s, nil, nil, "")
}

// showTool renders a tool's page, with the call form holding args and its
// errors, and a call's result.
func (h *Handler) showTool(w http.ResponseWriter, r *http.Request, s *session, args map[string]any, errs map[string]string,
	callErr string, result ...*connectorv1.CallToolResponse) {
	id, name := r.PathValue("id"), r.PathValue("tool")
	t, err := h.findTool(r.Context(), s, id, name)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	if t == nil {
		h.fail(w, r, s, http.StatusNotFound, "Not found", "Connector "+id+" has no tool "+name+".")
		return
	}
	d := toolData{ConnectorID: id, T: t, Error: callErr}
	schema := schemaOf(t)
	if b, err := json.MarshalIndent(t.GetInputSchema().AsMap(), "", "  "); err == nil {
		d.Schema = string(b)
	}
	if d.Form, err = schemaform.Form(schema, args, "", errs); err != nil {
		d.Error = "The tool's input schema cannot be shown as a form: " + err.Error()
	}
	if len(result) > 0 {
		d.Result = result[0]
	}
	code := http.StatusOK
	if len(errs) > 0 || callErr != "" {
		code = http.StatusBadRequest
	}
	h.render(w, r, s, code, "tool", name+" · "+id, d)
}

// updateTool switches a tool's enabled flag or its approval override.
func (h *Handler) updateTool(w http.ResponseWriter, r *http.Request, s *session) {
	id, name := r.PathValue("id"), r.PathValue("tool")
	req := &connectorv1.UpdateToolRequest{WorkspaceId: s.key.WorkspaceID, ConnectorId: id, ToolName: name}
	switch r.PostForm.Get("enabled") {
	case "true":
		req.Enabled = new(true)
	case "false":
		req.Enabled = new(false)
	}
	if a := r.PostForm.Get("approval"); a != "" {
		v, ok := connectorv1.ApprovalOverride_value["APPROVAL_OVERRIDE_"+a]
		if !ok {
			h.fail(w, r, s, http.StatusBadRequest, "Not saved", "approval: want POLICY, ALWAYS or NEVER, not "+a)
			return
		}
		req.ApprovalOverride = connectorv1.ApprovalOverride(v)
	}
	resp, err := h.api.UpdateTool(outgoing(r.Context(), s), req)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	t := resp.GetTool()
	state := "enabled"
	if !t.GetEnabled() {
		state = "disabled"
	}
	back := "/connectors/" + id
	if r.PostForm.Get("back") == "tool" {
		back += "/tools/" + name
	}
	done(w, r, back, "Tool "+name+" is "+state+"; approval: "+enumName("APPROVAL_OVERRIDE_", t.GetApprovalOverride().String())+".")
}

// callTool calls a tool with the arguments of its form, checked against
// its schema first.
func (h *Handler) callTool(w http.ResponseWriter, r *http.Request, s *session) {
	id, name := r.PathValue("id"), r.PathValue("tool")
	t, err := h.findTool(r.Context(), s, id, name)
	if err != nil || t == nil {
		h.showTool(w, r, s, nil, nil, "")
		return
	}
	args, errs := schemaform.Parse(schemaOf(t), r.PostForm, "")
	if len(errs) > 0 {
		h.showTool(w, r, s, args, errs, "The arguments do not match the tool's schema; nothing was called.")
		return
	}
	st, err := structpb.NewStruct(args)
	if err != nil {
		h.showTool(w, r, s, args, nil, "The arguments cannot be sent: "+err.Error())
		return
	}
	resp, err := h.api.CallTool(outgoing(r.Context(), s), &connectorv1.CallToolRequest{WorkspaceId: s.key.WorkspaceID,
		ConnectorId: id, ToolName: name, Arguments: st, UserApproved: r.PostForm.Get("approved") != ""})
	if err != nil {
		h.showTool(w, r, s, args, nil, apiMessage(err))
		return
	}
	h.showTool(w, r, s, args, nil, "", resp)
}

func enumName(prefix, v string) string {
	if len(v) > len(prefix) && v[:len(prefix)] == prefix {
		return v[len(prefix):]
	}
	return v
}
