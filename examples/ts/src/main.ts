// Calls connector-svc from a Node.js backend: the whole flow a chat backend
// needs, over gRPC, with the stubs generated into ../gen by
// scripts/gen-ts.sh. Copy what you need.
//
// Settings, from the environment:
//   CONNECTOR_SVC_ADDR       host:port of the service (default 127.0.0.1:50051)
//   CONNECTOR_SVC_API_KEY    an API key (csk_…), sent as "authorization: Bearer …";
//                            unset only against a service without keys
//   CONNECTOR_SVC_CA_FILE    PEM file of the CA that signed the service's
//                            certificate: TLS when set, plaintext otherwise
//   CONNECTOR_SVC_WORKSPACE  the workspace to work in (default demo)
//   CONNECTOR_SVC_MCP_URL    a streamable-HTTP MCP server with an echo tool, such as
//                            the reference server of the README's tour
//                            (default http://127.0.0.1:3001/mcp)
//
// Each step prints one line; a failure prints "error: …" and exits 1. The
// example deletes the connectors it made, so it runs again. Against a
// service without an LLM it skips the queries and does the rest.

import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createClient,
  type Client,
  type Interceptor,
} from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  ApprovalPolicy,
  ConnectorSchema,
  ConnectorState,
  SessionMode,
  Transport,
} from "../gen/connector/v1/connector_pb.js";
import { ConnectorService } from "../gen/connector/v1/connector_service_pb.js";
import { DecisionKind, QueryStatus } from "../gen/connector/v1/query_pb.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";

const addr = process.env.CONNECTOR_SVC_ADDR || "127.0.0.1:50051";
const apiKey = process.env.CONNECTOR_SVC_API_KEY;
const caFile = process.env.CONNECTOR_SVC_CA_FILE;
const workspaceId = process.env.CONNECTOR_SVC_WORKSPACE || "demo";
const mcpUrl = process.env.CONNECTOR_SVC_MCP_URL || "http://127.0.0.1:3001/mcp";

// Every call gets a deadline. A query runs a model and tools, so it gets
// longer than a plain call; the service bounds it by QUERY_TIMEOUT anyway.
const callTimeoutMs = 15_000;
const queryTimeoutMs = 120_000;

// bearer adds the API key to every call, as gRPC metadata.
function bearer(token: string): Interceptor {
  return (next) => async (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
}

// newClient makes one client for the whole process: the transport keeps one
// HTTP/2 connection and multiplexes every call over it, so share it rather
// than making a client per request.
function newClient(): Client<typeof ConnectorService> {
  const transport = createGrpcTransport({
    // The gRPC protocol over HTTP/2; https when a CA is given.
    baseUrl: `${caFile ? "https" : "http"}://${addr}`,
    // Trust the service's CA (the name dialled must be in its certificate).
    // For mutual TLS add cert and key here too.
    nodeOptions: caFile ? { ca: readFileSync(caFile) } : {},
    interceptors: apiKey ? [bearer(apiKey)] : [],
    defaultTimeoutMs: callTimeoutMs,
    // Ping an idle connection so a dead one is noticed before the next call.
    pingIntervalMs: 30_000,
  });
  return createClient(ConnectorService, transport);
}

const client = newClient();

// createConnector makes a streamable-HTTP connector; one that exists
// already (the example ran before) is used as it is.
async function createConnector(connector: MessageInitShape<typeof ConnectorSchema>): Promise<void> {
  const connectorId = connector.connectorId ?? "";
  try {
    const res = await client.createConnector({
      workspaceId,
      connector: {
        transport: Transport.STREAMABLE_HTTP,
        connection: { case: "http", value: { url: mcpUrl } },
        ...connector,
      },
    });
    const state = ConnectorState[res.connector?.health?.state ?? ConnectorState.UNSPECIFIED];
    console.log(`created connector ${connectorId}: ${state}`);
  } catch (err) {
    if (ConnectError.from(err).code !== Code.AlreadyExists) {
      throw err;
    }
    console.log(`connector ${connectorId} exists already: using it`);
  }
}

// waitReady polls GetConnector until the connector is READY. (A call made
// while a connector connects waits for the connect by itself; waiting here
// only makes the state visible.)
async function waitReady(connectorId: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const { connector } = await client.getConnector({ workspaceId, connectorId });
    const health = connector?.health;
    if (health?.state === ConnectorState.READY) {
      console.log(`connector ${connectorId} is READY with ${connector?.toolCount} tools`);
      return;
    }
    if (Date.now() > deadline) {
      const state = ConnectorState[health?.state ?? ConnectorState.UNSPECIFIED];
      throw new Error(`connector ${connectorId} is ${state} after 30 s: ${health?.lastError}`);
    }
    await sleep(200);
  }
}

// callEcho runs the echo tool and returns its text.
async function callEcho(connectorId: string, message: string, sessionId = ""): Promise<string> {
  const res = await client.callTool({
    workspaceId,
    connectorId,
    sessionId,
    toolName: "echo",
    // google.protobuf.Struct fields are plain JSON objects.
    arguments: { message },
  });
  return res.content
    .map((c) => (c.kind.case === "text" ? c.kind.value.text : `[${c.kind.case}]`))
    .join("");
}

// streamQuery asks the connector's agent a question and prints each event
// as it comes.
async function streamQuery(connectorId: string, query: string): Promise<void> {
  const stream = client.streamQueryConnector(
    { workspaceId, connectorId, query },
    { timeoutMs: queryTimeoutMs },
  );
  for await (const { event } of stream) {
    switch (event.case) {
      case "stepPlanned":
        console.log(`event stepPlanned: ${event.value.step?.calls.map((c) => c.tool).join(", ")}`);
        break;
      case "toolCallStarted":
        console.log(`event toolCallStarted: ${event.value.call?.tool} ${JSON.stringify(event.value.call?.arguments)}`);
        break;
      case "toolCallProgress":
        console.log(`event toolCallProgress: ${event.value.tool} ${event.value.progress?.progress}/${event.value.progress?.total}`);
        break;
      case "toolCallFinished":
        console.log(`event toolCallFinished: ${event.value.call?.tool}: ${event.value.call?.resultExcerpt}`);
        break;
      case "answer":
        console.log(`event answer: ${event.value.answer}`);
        break;
      case "approvalRequired":
        console.log(`event approvalRequired: run ${event.value.runId}`);
        break;
      case "result":
        console.log(`event result: ${QueryStatus[event.value.status]}`);
        break;
    }
  }
}

// approveEdited runs a query that pauses for approval, shows its pending
// calls, approves each with an edited message, and resumes the run.
async function approveEdited(connectorId: string, query: string, actorId: string): Promise<void> {
  const paused = (await client.queryConnector({ workspaceId, connectorId, query }, { timeoutMs: queryTimeoutMs })).result;
  if (paused?.status !== QueryStatus.AWAITING_APPROVAL) {
    throw new Error(`the query did not pause for approval: ${QueryStatus[paused?.status ?? 0]}`);
  }
  // The pending calls are what a person sees: tool, arguments, and why the
  // model wants them. Nothing of them has reached the MCP server yet.
  for (const call of paused.pendingCalls) {
    console.log(`pending call ${call.callId}: ${call.tool} ${JSON.stringify(call.arguments)}`);
  }
  const { result } = await client.resumeQuery(
    {
      workspaceId,
      runId: paused.runId,
      actorId, // who decided, kept in the run's record
      decisions: paused.pendingCalls.map((call) => ({
        callId: call.callId,
        kind: DecisionKind.APPROVE_EDITED,
        editedArguments: { ...call.arguments, message: `${call.arguments?.message} (approved by ${actorId})` },
      })),
    },
    { timeoutMs: queryTimeoutMs },
  );
  console.log(`resumed run ${paused.runId}: ${QueryStatus[result?.status ?? 0]}: ${result?.answer}`);
  for (const call of (result?.steps ?? []).flatMap((s) => s.calls)) {
    console.log(`ran ${call.tool}: ${call.resultExcerpt}`);
  }
}

// perSession calls a per-session connector as two users, lists their
// sessions and closes one.
async function perSession(connectorId: string): Promise<void> {
  for (const sessionId of ["alice", "bob"]) {
    console.log(`session ${sessionId}: ${await callEcho(connectorId, `hello from ${sessionId}`, sessionId)}`);
  }
  const { sessions } = await client.listSessions({ workspaceId, connectorId });
  console.log(`sessions: ${sessions.map((s) => `${s.sessionId} (${s.callCount} calls)`).join(", ")}`);
  const closed = await client.closeSession({ workspaceId, connectorId, sessionId: "alice" });
  console.log(`closed ${closed.closed} session(s): ${closed.sessions.map((s) => s.sessionId).join(", ")}`);
}

// reason returns the machine-readable reason of an error from the service:
// the google.rpc.ErrorInfo in its details (CONNECTOR_NOT_FOUND,
// TOOL_DISABLED, RATE_LIMITED, …). Branch on it, not on the message.
function reason(err: unknown): string {
  const [info] = ConnectError.from(err).findDetails(ErrorInfoSchema);
  return info?.reason ?? "";
}

async function main(): Promise<void> {
  console.log(`connecting to ${addr} (${caFile ? "TLS" : "plaintext"}, ${apiKey ? "with" : "without"} an API key)`);

  // A shared connector: create it, wait for READY, call a tool.
  await createConnector({
    connectorId: "ts-example",
    name: "TypeScript example",
    // The default policy, DESTRUCTIVE, pauses for tools not marked
    // read-only; this connector's calls need no approval.
    approvalPolicy: ApprovalPolicy.NONE,
  });
  await waitReady("ts-example");
  console.log(`echo: ${await callEcho("ts-example", "hello from TypeScript")}`);

  // Ask the connector's agent a question, streamed; then a query that
  // pauses for approval. Both need an LLM configured in the service: the
  // ErrorInfo reason says when there is none.
  try {
    await streamQuery("ts-example", "Say hello through the echo tool");
    await createConnector({ connectorId: "ts-example-careful", approvalPolicy: ApprovalPolicy.ALL });
    await waitReady("ts-example-careful");
    await approveEdited("ts-example-careful", "Say hello through the echo tool", "alice");
  } catch (err) {
    if (reason(err) !== "LLM_NOT_CONFIGURED") {
      throw err;
    }
    console.log("the service has no LLM (LLM_NOT_CONFIGURED): skipping the queries");
  }

  // Per-session connections: each caller session gets its own MCP session.
  await createConnector({
    connectorId: "ts-example-sessions",
    sessionMode: SessionMode.PER_SESSION,
    approvalPolicy: ApprovalPolicy.NONE,
  });
  await waitReady("ts-example-sessions");
  await perSession("ts-example-sessions");

  // Errors: the code says what kind, the ErrorInfo reason says which.
  try {
    await callEcho("no-such-connector", "hello");
    throw new Error("a call to a connector that does not exist succeeded");
  } catch (err) {
    const e = ConnectError.from(err);
    if (e.code !== Code.NotFound) {
      throw err;
    }
    console.log(`expected error: code ${Code[e.code]}, reason ${reason(err)}`);
  }

  // Clean up, so the example runs again.
  for (const connectorId of ["ts-example", "ts-example-careful", "ts-example-sessions"]) {
    try {
      await client.deleteConnector({ workspaceId, connectorId });
      console.log(`deleted connector ${connectorId}`);
    } catch (err) {
      if (reason(err) !== "CONNECTOR_NOT_FOUND") {
        throw err;
      }
    }
  }
  console.log("done");
}

main().catch((err: unknown) => {
  const e = ConnectError.from(err);
  console.error(`error: ${e.message}${reason(err) ? ` (${reason(err)})` : ""}`);
  process.exit(1);
});
