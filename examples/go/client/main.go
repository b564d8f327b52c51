// Command client is a Go backend's view of connector-svc: the calls a
// chat backend makes, in the order it would make them. Copy what you need.
//
// It connects to one or more replicas with client-side round robin and
// retries (the service config below), sends an API key with every call,
// and speaks TLS when given the service's CA. Then it creates a connector
// for an MCP server, waits until it is ready, calls a tool, streams a query,
// approves a paused query with edited arguments, uses per-session
// connections, and reads the machine-readable reason of an error.
//
// Settings (the API key only from the environment, so it never shows in ps):
//
//	CONNECTOR_SVC_ADDRS           comma-separated host:port of the replicas, or one
//	                              target such as dns:///connector-svc-headless.ns.svc.cluster.local:50051
//	                              (default 127.0.0.1:50051; flag -addrs)
//	CONNECTOR_SVC_API_KEY         an API key of the workspace (scope admin: the example creates connectors)
//	CONNECTOR_SVC_CA_FILE         the service's CA certificate (PEM): TLS when set, plaintext otherwise
//	CONNECTOR_SVC_MCP_URL         the MCP server's streamable-HTTP URL (default http://127.0.0.1:3001/mcp; flag -mcp-url)
//	CONNECTOR_SVC_WORKSPACE       the workspace (default demo; flag -workspace)
//	CONNECTOR_SVC_SERVICE_CONFIG  a gRPC service config file to use instead of the one built in (flag -service-config)
//
// Run it from the repository root: go run ./examples/go/client
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
)

// defaultServiceConfig spreads calls over every replica (round_robin; the
// default, pick_first, would send them all to one) and retries the reads
// when a replica answers UNAVAILABLE (it is stopping, or a hop to another
// replica failed). gRPC retries only a call that got no response headers,
// and a read is safe to run twice. CallTool, queries and changes are left
// out: whether a tool may run twice is yours to decide. The same JSON is
// in examples/service-config.json.
const defaultServiceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [
      {"service": "connector.v1.ConnectorService", "method": "GetConnector"},
      {"service": "connector.v1.ConnectorService", "method": "ListConnectors"},
      {"service": "connector.v1.ConnectorService", "method": "ListTools"},
      {"service": "connector.v1.ConnectorService", "method": "GetQueryRun"},
      {"service": "connector.v1.ConnectorService", "method": "ListQueryRuns"},
      {"service": "connector.v1.ConnectorService", "method": "ListSessions"}
    ],
    "retryPolicy": {
      "maxAttempts": 3,
      "initialBackoff": "0.05s",
      "maxBackoff": "0.5s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// config is what the example reads from its flags and environment.
type config struct {
	addrs, apiKey, caFile, mcpURL, workspace, serviceConfig string
}

func parseConfig(args []string, getenv func(string) string) (config, error) {
	or := func(env, def string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
	cfg := config{apiKey: getenv("CONNECTOR_SVC_API_KEY"), caFile: getenv("CONNECTOR_SVC_CA_FILE")}
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.StringVar(&cfg.addrs, "addrs", or("CONNECTOR_SVC_ADDRS", "127.0.0.1:50051"), "replicas' host:port, comma-separated, or one gRPC target")
	fs.StringVar(&cfg.mcpURL, "mcp-url", or("CONNECTOR_SVC_MCP_URL", "http://127.0.0.1:3001/mcp"), "the MCP server's streamable-HTTP URL")
	fs.StringVar(&cfg.workspace, "workspace", or("CONNECTOR_SVC_WORKSPACE", "demo"), "the workspace")
	fs.StringVar(&cfg.serviceConfig, "service-config", getenv("CONNECTOR_SVC_SERVICE_CONFIG"), "a gRPC service config file (default: the built-in one)")
	return cfg, fs.Parse(args)
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	cfg, err := parseConfig(args, getenv)
	if err != nil {
		return err
	}
	conn, err := dial(cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	ex := &example{client: connectorv1.NewConnectorServiceClient(conn), ws: cfg.workspace, mcpURL: cfg.mcpURL, out: out, keyed: cfg.apiKey != ""}
	return ex.tour(ctx)
}

// dial makes one client connection over every replica. Several addresses
// go to a manual resolver; on Kubernetes, pass one target instead,
// dns:///<headless service>:50051, and DNS gives every ready pod. A single
// host:port is a one-replica list.
func dial(cfg config) (*grpc.ClientConn, error) {
	serviceConfig := defaultServiceConfig
	if cfg.serviceConfig != "" {
		b, err := os.ReadFile(cfg.serviceConfig)
		if err != nil {
			return nil, fmt.Errorf("service config: %w", err)
		}
		serviceConfig = string(b)
	}
	opts := []grpc.DialOption{grpc.WithDefaultServiceConfig(serviceConfig)}
	target := cfg.addrs
	if !strings.Contains(target, ":///") {
		r := manual.NewBuilderWithScheme("replicas")
		var state resolver.State
		for _, a := range strings.Split(cfg.addrs, ",") {
			state.Addresses = append(state.Addresses, resolver.Address{Addr: strings.TrimSpace(a)})
		}
		r.InitialState(state)
		// The authority is what TLS checks the certificate against: the
		// first replica's host (every replica serves the same certificate).
		host, _, err := net.SplitHostPort(state.Addresses[0].Addr)
		if err != nil {
			return nil, fmt.Errorf("CONNECTOR_SVC_ADDRS: %w", err)
		}
		target = "replicas:///" + host
		opts = append(opts, grpc.WithResolvers(r))
	}
	if cfg.caFile != "" {
		creds, err := credentials.NewClientTLSFromFile(cfg.caFile, "")
		if err != nil {
			return nil, fmt.Errorf("CONNECTOR_SVC_CA_FILE: %w", err)
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if cfg.apiKey != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: cfg.apiKey, tls: cfg.caFile != ""}))
	}
	return grpc.NewClient(target, opts...)
}

// bearer sends an API key as "authorization: Bearer <key>" with every call.
type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false without TLS only so that the example
// runs against `make run` on loopback; send keys over TLS anywhere else.
func (b bearer) RequireTransportSecurity() bool { return b.tls }

// example holds what every step uses.
type example struct {
	client connectorv1.ConnectorServiceClient
	ws     string
	mcpURL string
	out    io.Writer
	keyed  bool     // an API key is sent
	made   []string // the connectors this run created or found, deleted at the end
}

func (e *example) printf(format string, a ...any) { fmt.Fprintf(e.out, format+"\n", a...) }

// tour runs the steps in order and deletes the connectors it made.
func (e *example) tour(ctx context.Context) error {
	ids := []string{"go-example", "go-example-careful", "go-example-sessions"}
	if err := e.spread(ctx); err != nil {
		return err
	}
	defer e.cleanup()
	if err := e.createAndWait(ctx, ids[0], connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE, connectorv1.SessionMode_SESSION_MODE_SHARED); err != nil {
		return err
	}
	if err := e.callTool(ctx, ids[0]); err != nil {
		return err
	}
	switch err := e.streamQuery(ctx, ids[0]); {
	case reason(err) == "LLM_NOT_CONFIGURED":
		e.printf("the service has no LLM (LLM_NOT_CONFIGURED): skipping the queries")
	case err != nil:
		return err
	default:
		if err := e.createAndWait(ctx, ids[1], connectorv1.ApprovalPolicy_APPROVAL_POLICY_ALL, connectorv1.SessionMode_SESSION_MODE_SHARED); err != nil {
			return err
		}
		if err := e.approve(ctx, ids[1]); err != nil {
			return err
		}
	}
	if err := e.createAndWait(ctx, ids[2], connectorv1.ApprovalPolicy_APPROVAL_POLICY_NONE, connectorv1.SessionMode_SESSION_MODE_PER_SESSION); err != nil {
		return err
	}
	if err := e.sessions(ctx, ids[2]); err != nil {
		return err
	}
	e.errorReason(ctx)
	e.printf("done")
	return nil
}

// spread makes a few calls and prints which replica served each: with
// round_robin they take turns.
func (e *example) spread(ctx context.Context) error {
	var served []string
	for range 6 {
		var p peer.Peer
		if _, err := e.client.ListConnectors(ctx, &connectorv1.ListConnectorsRequest{WorkspaceId: e.ws}, grpc.Peer(&p)); err != nil {
			return e.keyError(err)
		}
		served = append(served, p.Addr.String())
	}
	e.printf("ListConnectors served by: %s", strings.Join(served, " "))
	return nil
}

// keyError explains the first call's failure when it is the API key's:
// none sent while the service asks for one, or one it refuses.
func (e *example) keyError(err error) error {
	switch code := status.Code(err); {
	case code == codes.Unauthenticated && !e.keyed:
		return fmt.Errorf("no API key: set CONNECTOR_SVC_API_KEY to a key of workspace %s with scope admin, e.g. "+
			"export CONNECTOR_SVC_API_KEY=$(.dev/bin/connector-svc keys create --workspace %s --scope admin --name go-example) "+
			"(the service answered %s)", e.ws, e.ws, reason(err))
	case code == codes.Unauthenticated, code == codes.PermissionDenied:
		return fmt.Errorf("the service refused CONNECTOR_SVC_API_KEY (%s): %s", reason(err), status.Convert(err).Message())
	}
	return fmt.Errorf("ListConnectors: %w", err)
}

// createAndWait creates a streamable-HTTP connector and polls GetConnector
// until it is READY. CreateConnector answers at once, CONNECTING; a
// connector that already exists (a second run) is used as it is.
func (e *example) createAndWait(ctx context.Context, id string, policy connectorv1.ApprovalPolicy, mode connectorv1.SessionMode) error {
	_, err := e.client.CreateConnector(ctx, &connectorv1.CreateConnectorRequest{WorkspaceId: e.ws, Connector: &connectorv1.Connector{
		ConnectorId: id, Transport: connectorv1.Transport_TRANSPORT_STREAMABLE_HTTP, ApprovalPolicy: policy, SessionMode: mode,
		Connection: &connectorv1.Connector_Http{Http: &connectorv1.HttpConfig{Url: e.mcpURL}}}})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("CreateConnector %s: %w", id, err)
	}
	e.made = append(e.made, id)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		resp, err := e.client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: e.ws, ConnectorId: id})
		if err != nil {
			return fmt.Errorf("GetConnector %s: %w", id, err)
		}
		if c := resp.GetConnector(); c.GetHealth().GetState() == connectorv1.ConnectorState_CONNECTOR_STATE_READY {
			e.printf("connector %s: %s, %d tools", id, c.GetHealth().GetState(), c.GetToolCount())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("connector %s not READY: %w (last: %s %s)", id, ctx.Err(), resp.GetConnector().GetHealth().GetState(), resp.GetConnector().GetHealth().GetLastError())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// callTool runs one tool over the connector's shared MCP session.
func (e *example) callTool(ctx context.Context, id string) error {
	args, _ := structpb.NewStruct(map[string]any{"message": "hello from Go"})
	resp, err := e.client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: e.ws, ConnectorId: id, ToolName: "echo", Arguments: args})
	if err != nil {
		return fmt.Errorf("CallTool: %w", err)
	}
	e.printf("CallTool echo: %s", text(resp.GetContent()))
	return nil
}

// text joins the text items of a tool result.
func text(content []*connectorv1.Content) string {
	var parts []string
	for _, c := range content {
		if t := c.GetText(); t != nil {
			parts = append(parts, t.GetText())
		}
	}
	return strings.Join(parts, " ")
}

// streamQuery asks the connector agent a question and prints each event
// as it comes. The stream ends with the result.
func (e *example) streamQuery(ctx context.Context, id string) error {
	stream, err := e.client.StreamQueryConnector(ctx, &connectorv1.StreamQueryConnectorRequest{WorkspaceId: e.ws, ConnectorId: id,
		Query: "Say hello through the echo tool"})
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err // LLM_NOT_CONFIGURED arrives here, as the stream's status
		}
		switch ev := msg.GetEvent().(type) {
		case *connectorv1.StreamQueryConnectorResponse_StepPlanned:
			e.printf("event step_planned: step %d, %d calls", ev.StepPlanned.GetStep().GetIndex(), len(ev.StepPlanned.GetStep().GetCalls()))
		case *connectorv1.StreamQueryConnectorResponse_ToolCallStarted:
			e.printf("event tool_call_started: %s", ev.ToolCallStarted.GetCall().GetTool())
		case *connectorv1.StreamQueryConnectorResponse_ToolCallProgress:
			e.printf("event tool_call_progress: %s %v/%v", ev.ToolCallProgress.GetTool(),
				ev.ToolCallProgress.GetProgress().GetProgress(), ev.ToolCallProgress.GetProgress().GetTotal())
		case *connectorv1.StreamQueryConnectorResponse_ToolCallFinished:
			e.printf("event tool_call_finished: %s: %s", ev.ToolCallFinished.GetCall().GetTool(), ev.ToolCallFinished.GetCall().GetResultExcerpt())
		case *connectorv1.StreamQueryConnectorResponse_ApprovalRequired:
			e.printf("event approval_required: run %s", ev.ApprovalRequired.GetRunId())
		case *connectorv1.StreamQueryConnectorResponse_Answer:
			e.printf("event answer: %s", ev.Answer.GetAnswer())
		case *connectorv1.StreamQueryConnectorResponse_Result:
			e.printf("event result: %s, tools used %v", ev.Result.GetStatus(), ev.Result.GetToolsUsed())
		}
	}
}

// approve runs a query on a connector whose every call waits for a person
// (APPROVAL_POLICY_ALL). The query pauses before its call; the backend
// shows the pending calls to the user, then resumes with their decision,
// here an approval with an edited argument.
func (e *example) approve(ctx context.Context, id string) error {
	resp, err := e.client.QueryConnector(ctx, &connectorv1.QueryConnectorRequest{WorkspaceId: e.ws, ConnectorId: id, Query: "Say hello through the echo tool"})
	if err != nil {
		return fmt.Errorf("QueryConnector: %w", err)
	}
	paused := resp.GetResult()
	e.printf("query %s: %s", paused.GetRunId(), paused.GetStatus())
	if paused.GetStatus() != connectorv1.QueryStatus_QUERY_STATUS_AWAITING_APPROVAL {
		return fmt.Errorf("the query did not pause for approval: %s", paused.GetStatus())
	}
	// The run is in Postgres: any replica, now or after a restart, shows it.
	run, err := e.client.GetQueryRun(ctx, &connectorv1.GetQueryRunRequest{WorkspaceId: e.ws, RunId: paused.GetRunId()})
	if err != nil {
		return fmt.Errorf("GetQueryRun: %w", err)
	}
	var decisions []*connectorv1.Decision
	for _, call := range run.GetRun().GetResult().GetPendingCalls() {
		e.printf("pending call %s: %s %v", call.GetCallId(), call.GetTool(), call.GetArguments().AsMap())
		edited, _ := structpb.NewStruct(map[string]any{"message": "hello, edited by alice"})
		decisions = append(decisions, &connectorv1.Decision{CallId: call.GetCallId(),
			Kind: connectorv1.DecisionKind_DECISION_KIND_APPROVE_EDITED, EditedArguments: edited})
	}
	done, err := e.client.ResumeQuery(ctx, &connectorv1.ResumeQueryRequest{WorkspaceId: e.ws, RunId: paused.GetRunId(), ActorId: "alice", Decisions: decisions})
	if err != nil {
		return fmt.Errorf("ResumeQuery: %w", err)
	}
	r := done.GetResult()
	for _, step := range r.GetSteps() {
		for _, c := range step.GetCalls() {
			e.printf("resumed call %s: %s (decided by %s)", c.GetTool(), c.GetResultExcerpt(), c.GetDecision().GetActorId())
		}
	}
	e.printf("resumed query: %s: %s", r.GetStatus(), r.GetAnswer())
	return nil
}

// sessions calls a per-session connector as two users: each gets an MCP
// connection of its own. Then it lists and closes them.
func (e *example) sessions(ctx context.Context, id string) error {
	for _, user := range []string{"alice", "bob"} {
		args, _ := structpb.NewStruct(map[string]any{"message": "hello from " + user})
		resp, err := e.client.CallTool(ctx, &connectorv1.CallToolRequest{WorkspaceId: e.ws, ConnectorId: id, SessionId: user, ToolName: "echo", Arguments: args})
		if err != nil {
			return fmt.Errorf("CallTool in session %s: %w", user, err)
		}
		e.printf("session %s: %s", user, text(resp.GetContent()))
	}
	list, err := e.client.ListSessions(ctx, &connectorv1.ListSessionsRequest{WorkspaceId: e.ws, ConnectorId: id})
	if err != nil {
		return fmt.Errorf("ListSessions: %w", err)
	}
	for _, s := range list.GetSessions() {
		e.printf("listed session %s: %s, %d calls", s.GetSessionId(), s.GetState(), s.GetCallCount())
	}
	// With a connector_id, one connector's session; without, the session on
	// every connector of the workspace (a user logging out).
	for _, req := range []*connectorv1.CloseSessionRequest{
		{WorkspaceId: e.ws, ConnectorId: id, SessionId: "alice"},
		{WorkspaceId: e.ws, SessionId: "bob"},
	} {
		closed, err := e.client.CloseSession(ctx, req)
		if err != nil {
			return fmt.Errorf("CloseSession: %w", err)
		}
		e.printf("closed session %s: %d", req.GetSessionId(), closed.GetClosed())
	}
	return nil
}

// errorReason shows how to tell errors apart: by the google.rpc.ErrorInfo
// reason the service attaches, not by the message text.
func (e *example) errorReason(ctx context.Context) {
	_, err := e.client.GetConnector(ctx, &connectorv1.GetConnectorRequest{WorkspaceId: e.ws, ConnectorId: "no-such-connector"})
	e.printf("GetConnector no-such-connector: code %s, reason %s", status.Code(err), reason(err))
}

// reason is the ErrorInfo reason of a gRPC error, "" if it has none.
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// cleanup deletes the connectors the example made, so that it runs again.
func (e *example) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range e.made {
		_, err := e.client.DeleteConnector(ctx, &connectorv1.DeleteConnectorRequest{WorkspaceId: e.ws, ConnectorId: id})
		if err != nil && status.Code(err) != codes.NotFound {
			e.printf("DeleteConnector %s: %v", id, err)
		}
	}
}
