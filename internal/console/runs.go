package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"reflect"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/console/schemaform"
)

// runStatuses are the run list's filters.
var runStatuses = []option{{"", "All"}, {"AWAITING_APPROVAL", "Awaiting approval"}, {"AWAITING_INPUT", "Awaiting input"},
	{"AWAITING_AUTHORIZATION", "Awaiting authorization"}, {"RUNNING", "Running"}, {"COMPLETED", "Completed"},
	{"FAILED", "Failed"}, {"EXPIRED", "Expired"}, {"BUDGET_EXHAUSTED", "Budget exhausted"}}

type runsData struct {
	Status    string
	Connector string
	Statuses  []option
	Runs      []*connectorv1.QueryRun
	Next      string
}

func (h *Handler) runsPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := runsData{Status: q.Get("status"), Connector: strings.TrimSpace(q.Get("connector")), Statuses: runStatuses}
	req := &connectorv1.ListQueryRunsRequest{WorkspaceId: s.key.WorkspaceID, ConnectorId: d.Connector, PageSize: 50, PageToken: q.Get("page")}
	if d.Status != "" {
		v, ok := connectorv1.QueryStatus_value["QUERY_STATUS_"+d.Status]
		if !ok {
			h.fail(w, r, s, http.StatusBadRequest, "Bad filter", fmt.Sprintf("status %q is not a run status", d.Status))
			return
		}
		req.Status = connectorv1.QueryStatus(v)
	}
	resp, err := h.api.ListQueryRuns(outgoing(r.Context(), s), req)
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	d.Runs, d.Next = resp.GetRuns(), resp.GetNextPageToken()
	h.render(w, r, s, http.StatusOK, "runs", "Runs", d)
}

// pendingForm is one call waiting for approval, as a form.
type pendingForm struct {
	Index  int
	P      *connectorv1.PendingCall
	Form   template.HTML
	Denied bool
	Msg    string
}

type runData struct {
	Run     *connectorv1.QueryRun
	Pending []pendingForm
	Error   string
}

func (h *Handler) runPage(w http.ResponseWriter, r *http.Request, s *session) {
	h.showRun(w, r, s, nil, "")
}

// schemas are the input schemas of a connector's tools, when the key may
// read the catalog (admin); without, calls are edited as JSON.
func (h *Handler) schemas(r *http.Request, s *session, connector string) map[string][]byte {
	out := map[string][]byte{}
	if !s.key.Allows(auth.ScopeAdmin) {
		return out
	}
	tools, err := h.listTools(r.Context(), s, connector)
	if err != nil {
		return out
	}
	for _, t := range tools {
		out[t.GetName()] = schemaOf(t)
	}
	return out
}

// showRun renders a run; posted holds what was sent when a decision was
// refused, with each call's errors.
func (h *Handler) showRun(w http.ResponseWriter, r *http.Request, s *session, posted map[int]postedCall, msg string) {
	resp, err := h.api.GetQueryRun(outgoing(r.Context(), s), &connectorv1.GetQueryRunRequest{WorkspaceId: s.key.WorkspaceID, RunId: r.PathValue("id")})
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	run := resp.GetRun()
	d := runData{Run: run, Error: msg}
	if run.GetStatus() == connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		schemas := h.schemas(r, s, run.GetConnectorId())
		for i, p := range run.GetResult().GetPendingCalls() {
			args := p.GetArguments().AsMap()
			var errs map[string]string
			pf := pendingForm{Index: i, P: p}
			if pc, ok := posted[i]; ok {
				args, errs, pf.Denied, pf.Msg = pc.args, pc.errs, pc.deny, pc.msg
			}
			if pf.Form, err = schemaform.Form(schemas[p.GetTool()], args, prefix(i), errs); err != nil {
				pf.Form, _ = schemaform.Form(nil, args, prefix(i), errs)
			}
			d.Pending = append(d.Pending, pf)
		}
	}
	code := http.StatusOK
	if msg != "" {
		code = http.StatusBadRequest
	}
	h.render(w, r, s, code, "run", "Run "+run.GetRunId(), d)
}

func prefix(i int) string { return fmt.Sprintf("c%d.", i) }

// postedCall is one call's decision as posted.
type postedCall struct {
	args map[string]any
	errs map[string]string
	deny bool
	msg  string
}

// resumeRun sends the decisions on a run's pending calls: approve as the
// model asked, approve with the arguments edited in the form (checked
// against the tool's schema first), or deny with a message.
func (h *Handler) resumeRun(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	resp, err := h.api.GetQueryRun(outgoing(r.Context(), s), &connectorv1.GetQueryRunRequest{WorkspaceId: s.key.WorkspaceID, RunId: id})
	if err != nil {
		h.apiFail(w, r, s, err)
		return
	}
	run := resp.GetRun()
	if run.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		h.showRun(w, r, s, nil, "This run is "+enumName("QUERY_STATUS_", run.GetStatus().String())+
			" now, not awaiting approval: someone else may have decided.")
		return
	}
	schemas := h.schemas(r, s, run.GetConnectorId())
	posted := map[int]postedCall{}
	var decisions []*connectorv1.Decision
	bad := false
	for i, p := range run.GetResult().GetPendingCalls() {
		pc := postedCall{deny: r.PostForm.Get(prefix(i)+"decision") == "deny", msg: r.PostForm.Get(prefix(i) + "message")}
		dec := &connectorv1.Decision{CallId: p.GetCallId()}
		pc.args, pc.errs = schemaform.Parse(schemas[p.GetTool()], r.PostForm, prefix(i))
		switch {
		case r.PostForm.Get(prefix(i)+"decision") == "":
			pc.errs = map[string]string{"": "choose approve or deny"}
			bad = true
		case pc.deny:
			dec.Kind, dec.Message, pc.errs = connectorv1.DecisionKind_DECISION_KIND_DENY, pc.msg, nil
		case len(pc.errs) > 0:
			bad = true
		case sameArgs(pc.args, p.GetArguments().AsMap()):
			dec.Kind = connectorv1.DecisionKind_DECISION_KIND_APPROVE
		default:
			st, err := structpb.NewStruct(pc.args)
			if err != nil {
				pc.errs, bad = map[string]string{"": err.Error()}, true
				break
			}
			dec.Kind, dec.EditedArguments = connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED, st
		}
		posted[i] = pc
		decisions = append(decisions, dec)
	}
	if bad {
		h.showRun(w, r, s, posted, "Nothing was sent: correct the calls marked below.")
		return
	}
	_, err = h.api.ResumeQuery(outgoing(r.Context(), s), &connectorv1.ResumeQueryRequest{WorkspaceId: s.key.WorkspaceID,
		RunId: id, Decisions: decisions, ActorId: "console:" + s.key.ID})
	if err != nil {
		h.showRun(w, r, s, posted, apiMessage(err))
		return
	}
	done(w, r, "/runs/"+id, "Decisions sent.")
}

// sameArgs compares arguments as JSON: the form's numbers may come back
// as integers where the model's were floats.
func sameArgs(a, b map[string]any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	var na, nb any
	_ = json.Unmarshal(ja, &na)
	_ = json.Unmarshal(jb, &nb)
	return reflect.DeepEqual(na, nb)
}
