package console

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// listAll reads every connector of the key's workspace.
func (h *Handler) listAll(ctx context.Context, s *session) ([]*connectorv1.Connector, error) {
	return all(func(token string) ([]*connectorv1.Connector, string, error) {
		resp, err := h.api.ListConnectors(outgoing(ctx, s), &connectorv1.ListConnectorsRequest{
			WorkspaceId: s.key.WorkspaceID, PageSize: 1000, PageToken: token})
		return resp.GetConnectors(), resp.GetNextPageToken(), err
	})
}

// all reads every page of a list; page reads the one after token.
func all[T any](page func(token string) ([]T, string, error)) ([]T, error) {
	var out []T
	token := ""
	for {
		items, next, err := page(token)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if token = next; token == "" {
			return out, nil
		}
	}
}

// connectorRow is a connector in the live list.
type connectorRow struct {
	C     *connectorv1.Connector
	Owner string
}

type connectorsData struct {
	Rows []connectorRow
}

// rows reads the list with each connector's owner.
func (h *Handler) rows(ctx context.Context, s *session) (connectorsData, error) {
	cs, err := h.listAll(ctx, s)
	if err != nil {
		return connectorsData{}, err
	}
	owners := map[string]string{}
	if h.cluster != nil {
		if rs, err := h.cluster.Replicas(ctx, s.key.WorkspaceID); err == nil {
			owners = rs.Owners
		}
	}
	d := connectorsData{}
	for _, c := range cs {
		d.Rows = append(d.Rows, connectorRow{C: c, Owner: owners[c.GetConnectorId()]})
	}
	return d, nil
}

func (h *Handler) connectorsPage(w http.ResponseWriter, r *http.Request, s *session) {
	d, err := h.rows(r.Context(), s)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	h.render(w, r, s, http.StatusOK, "connectors", "Connectors", d)
}

// connectorEvents streams the list's rows (server-sent events) whenever
// they change, until the person leaves or their key is revoked.
func (h *Handler) connectorEvents(w http.ResponseWriter, r *http.Request, s *session) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 3000\n\n")
	flusher.Flush()
	tick := time.NewTicker(h.cfg.Refresh)
	defer tick.Stop()
	var last []byte
	for {
		if _, err := h.session(r); err != nil {
			fmt.Fprint(w, "event: signedout\ndata: signed out\n\n")
			flusher.Flush()
			return
		}
		if d, err := h.rows(r.Context(), s); err == nil {
			var buf bytes.Buffer
			if err := h.pages["connectors"].ExecuteTemplate(&buf, "rows", d); err == nil && !bytes.Equal(buf.Bytes(), last) {
				last = buf.Bytes()
				fmt.Fprint(w, "event: rows\n")
				for line := range strings.SplitSeq(buf.String(), "\n") {
					fmt.Fprintf(w, "data: %s\n", line)
				}
				fmt.Fprint(w, "\n")
				flusher.Flush()
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// connectorForm is the create and edit form's fields. Secrets (env values,
// headers) are write-only: never shown, kept when left empty on edit.
type connectorForm struct {
	Edit                          bool
	ID, Name, Description         string
	Transport                     string
	Command, Args                 string
	URL                           string
	EnvKeys, HeaderNames          []string
	Approval, SessionMode, Model  string
	DisableNewTools, Active       bool
	Error                         string
	Env, Headers                  string // what was posted; never rendered
	Transports, Approvals, Modes  []option
	ApprovalNames, TransportNames map[string]string
	SessionModeNames              map[string]string
}

type option struct{ Value, Label string }

var transports = []option{{"streamable_http", "Streamable HTTP"}, {"sse", "SSE"}, {"stdio", "stdio (a local command)"}}
var approvals = []option{{"destructive", "Calls of tools that may change something"}, {"all", "Every call"}, {"none", "No call"}}
var sessionModes = []option{{"shared", "One connection for every caller"}, {"per_session", "One connection per caller session"}}

func (f *connectorForm) options() {
	f.Transports, f.Approvals, f.Modes = transports, approvals, sessionModes
}

func formFromConnector(c *connectorv1.Connector) connectorForm {
	f := connectorForm{Edit: true, ID: c.GetConnectorId(), Name: c.GetName(), Description: c.GetDescription(),
		Model: c.GetModel(), DisableNewTools: c.GetDisableNewTools(), Active: c.GetActive()}
	f.Transport = strings.ToLower(strings.TrimPrefix(c.GetTransport().String(), "TRANSPORT_"))
	f.Approval = strings.ToLower(strings.TrimPrefix(c.GetApprovalPolicy().String(), "APPROVAL_POLICY_"))
	f.SessionMode = strings.ToLower(strings.TrimPrefix(c.GetSessionMode().String(), "SESSION_MODE_"))
	if st := c.GetStdio(); st != nil {
		f.Command, f.Args, f.EnvKeys = st.GetCommand(), strings.Join(st.GetArgs(), "\n"), st.GetEnvKeys()
	}
	if hc := c.GetHttp(); hc != nil {
		f.URL, f.HeaderNames = hc.GetUrl(), hc.GetHeaderNames()
	}
	return f
}

func readConnectorForm(r *http.Request, edit bool) connectorForm {
	v := r.PostForm
	return connectorForm{Edit: edit, ID: strings.TrimSpace(v.Get("id")), Name: v.Get("name"), Description: v.Get("description"),
		Transport: v.Get("transport"), Command: strings.TrimSpace(v.Get("command")), Args: v.Get("args"), URL: strings.TrimSpace(v.Get("url")),
		Env: v.Get("env"), Headers: v.Get("headers"), Approval: v.Get("approval"), SessionMode: v.Get("session_mode"),
		Model: strings.TrimSpace(v.Get("model")), DisableNewTools: v.Get("disable_new_tools") != "", Active: v.Get("active") != ""}
}

// connector builds the API's connector from the form; the API checks it.
func (f connectorForm) connector() (*connectorv1.Connector, error) {
	c := &connectorv1.Connector{ConnectorId: f.ID, Name: f.Name, Description: f.Description, Model: f.Model,
		DisableNewTools: f.DisableNewTools,
		Transport:       connectorv1.Transport(connectorv1.Transport_value["TRANSPORT_"+strings.ToUpper(f.Transport)]),
		ApprovalPolicy:  connectorv1.ApprovalPolicy(connectorv1.ApprovalPolicy_value["APPROVAL_POLICY_"+strings.ToUpper(f.Approval)]),
		SessionMode:     connectorv1.SessionMode(connectorv1.SessionMode_value["SESSION_MODE_"+strings.ToUpper(f.SessionMode)])}
	switch c.Transport {
	case connectorv1.Transport_TRANSPORT_STDIO:
		env, err := pairs(f.Env, "=", "environment")
		if err != nil {
			return nil, err
		}
		c.Connection = &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: f.Command, Args: lines(f.Args), Env: env}}
	case connectorv1.Transport_TRANSPORT_SSE, connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP:
		headers, err := pairs(f.Headers, ":", "headers")
		if err != nil {
			return nil, err
		}
		c.Connection = &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: f.URL, Headers: headers}}
	}
	return c, nil
}

// lines are a textarea's non-empty lines.
func lines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if l = strings.TrimRight(l, "\r"); strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// pairs reads "NAME<sep>value" lines; the error names the line, not its
// value (a secret).
func pairs(s, sep, what string) (map[string]string, error) {
	out := map[string]string{}
	for i, l := range lines(s) {
		k, v, ok := strings.Cut(l, sep)
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s, line %d: write NAME%svalue", what, i+1, sep)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func (h *Handler) newConnectorPage(w http.ResponseWriter, r *http.Request, s *session) {
	f := connectorForm{Transport: "streamable_http", Approval: "destructive", SessionMode: "shared", Active: true}
	f.options()
	h.render(w, r, s, http.StatusOK, "connector_form", "New connector", f)
}

func (h *Handler) createConnector(w http.ResponseWriter, r *http.Request, s *session) {
	f := readConnectorForm(r, false)
	c, err := f.connector()
	if err == nil {
		active := f.Active
		_, err = h.api.CreateConnector(outgoing(r.Context(), s), &connectorv1.CreateConnectorRequest{
			WorkspaceId: s.key.WorkspaceID, Connector: c, Active: &active})
	}
	if err != nil {
		h.formError(w, r, s, "New connector", f, err)
		return
	}
	done(w, r, "/connectors/"+f.ID, "Created connector "+f.ID+".")
}

// formError shows the form again with what was wrong; the secrets posted
// are not sent back.
func (h *Handler) formError(w http.ResponseWriter, r *http.Request, s *session, title string, f connectorForm, err error) {
	f.Error = apiMessage(err)
	if !strings.HasSuffix(f.Error, ".") {
		f.Error += "."
	}
	if f.Env != "" || f.Headers != "" {
		f.Error += " The environment values and headers you entered are not shown again: enter them again."
	}
	f.Env, f.Headers = "", ""
	f.options()
	h.render(w, r, s, httpStatusOf(err), "connector_form", title, f)
}

func (h *Handler) getConnector(ctx context.Context, s *session, id string) (*connectorv1.Connector, error) {
	resp, err := h.api.GetConnector(outgoing(ctx, s), &connectorv1.GetConnectorRequest{WorkspaceId: s.key.WorkspaceID, ConnectorId: id})
	return resp.GetConnector(), err
}

type connectorData struct {
	C     *connectorv1.Connector
	Tools []*connectorv1.Tool
	Owner string
}

func (h *Handler) connectorPage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	c, err := h.getConnector(r.Context(), s, id)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	tools, err := h.listTools(r.Context(), s, id)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	d := connectorData{C: c, Tools: tools}
	if h.cluster != nil {
		if rs, err := h.cluster.Replicas(r.Context(), s.key.WorkspaceID); err == nil {
			d.Owner = rs.Owners[id]
		}
	}
	h.render(w, r, s, http.StatusOK, "connector", "Connector "+id, d)
}

func (h *Handler) editConnectorPage(w http.ResponseWriter, r *http.Request, s *session) {
	c, err := h.getConnector(r.Context(), s, r.PathValue("id"))
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	f := formFromConnector(c)
	f.options()
	h.render(w, r, s, http.StatusOK, "connector_form", "Edit "+c.GetConnectorId(), f)
}

func (h *Handler) updateConnector(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	old, err := h.getConnector(r.Context(), s, id)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	f := readConnectorForm(r, true)
	f.ID = id
	prev := formFromConnector(old)
	f.EnvKeys, f.HeaderNames = prev.EnvKeys, prev.HeaderNames
	c, err := f.connector()
	if err == nil {
		mask := []string{"name", "description", "transport", "approval_policy", "session_mode", "model", "disable_new_tools"}
		switch {
		case f.Transport != prev.Transport && f.Transport == "stdio":
			mask = append(mask, "stdio")
		case f.Transport != prev.Transport:
			mask = append(mask, "http")
		case f.Transport == "stdio":
			mask = append(mask, "stdio.command", "stdio.args")
			if strings.TrimSpace(f.Env) != "" {
				mask = append(mask, "stdio.env")
			}
		default:
			mask = append(mask, "http.url")
			if strings.TrimSpace(f.Headers) != "" {
				mask = append(mask, "http.headers")
			}
		}
		_, err = h.api.UpdateConnector(outgoing(r.Context(), s), &connectorv1.UpdateConnectorRequest{WorkspaceId: s.key.WorkspaceID,
			Connector: c, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}})
	}
	if err != nil {
		h.formError(w, r, s, "Edit "+id, f, err)
		return
	}
	done(w, r, "/connectors/"+id, "Saved connector "+id+".")
}

// connectorAction runs activate, deactivate, check or refresh.
func (h *Handler) connectorAction(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	ctx, ws := outgoing(r.Context(), s), s.key.WorkspaceID
	action := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	var msg string
	var err error
	switch action {
	case "activate":
		_, err = h.api.ActivateConnector(ctx, &connectorv1.ActivateConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		msg = "Activated " + id + "."
	case "deactivate":
		_, err = h.api.DeactivateConnector(ctx, &connectorv1.DeactivateConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		msg = "Deactivated " + id + "."
	case "check":
		var resp *connectorv1.CheckConnectorResponse
		resp, err = h.api.CheckConnector(ctx, &connectorv1.CheckConnectorRequest{WorkspaceId: ws, ConnectorId: id})
		hl := resp.GetHealth()
		msg = fmt.Sprintf("Checked %s: %s", id, strings.TrimPrefix(hl.GetState().String(), "CONNECTOR_STATE_"))
		if hl.GetLastError() != "" {
			msg += " (" + hl.GetLastError() + ")"
		}
		msg += "."
	case "refresh":
		var resp *connectorv1.RefreshToolsResponse
		resp, err = h.api.RefreshTools(ctx, &connectorv1.RefreshToolsRequest{WorkspaceId: ws, ConnectorId: id})
		msg = fmt.Sprintf("Refreshed the tools of %s: %d.", id, len(resp.GetTools()))
	}
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	done(w, r, "/connectors/"+id, msg)
}

func (h *Handler) deleteConnectorPage(w http.ResponseWriter, r *http.Request, s *session) {
	c, err := h.getConnector(r.Context(), s, r.PathValue("id"))
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	h.render(w, r, s, http.StatusOK, "connector_delete", "Delete "+c.GetConnectorId(), connectorData{C: c})
}

func (h *Handler) deleteConnector(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if r.PostForm.Get("confirm") != id {
		h.fail(w, r, s, http.StatusBadRequest, "Not deleted", "Type the connector's id, "+id+", to confirm.")
		return
	}
	if _, err := h.api.DeleteConnector(outgoing(r.Context(), s), &connectorv1.DeleteConnectorRequest{
		WorkspaceId: s.key.WorkspaceID, ConnectorId: id}); err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	done(w, r, "/connectors", "Deleted connector "+id+".")
}

// replicasData is the replicas page.
type replicasData struct {
	R        Replicas
	Owned    map[string][]string
	Alone    bool
	Unowned  []string
	Failures string
}

func (h *Handler) replicasPage(w http.ResponseWriter, r *http.Request, s *session) {
	cs, err := h.listAll(r.Context(), s)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	d := replicasData{Owned: map[string][]string{}}
	if h.cluster == nil {
		d.Alone = true
	} else if d.R, err = h.cluster.Replicas(r.Context(), s.key.WorkspaceID); err != nil {
		d.Failures = "The replica set cannot be read now: " + err.Error()
	}
	for _, c := range cs {
		id := c.GetConnectorId()
		if o := d.R.Owners[id]; o != "" {
			d.Owned[o] = append(d.Owned[o], id)
		} else if !d.Alone {
			d.Unowned = append(d.Unowned, id)
		}
	}
	slices.Sort(d.Unowned)
	h.render(w, r, s, http.StatusOK, "replicas", "Replicas", d)
}
