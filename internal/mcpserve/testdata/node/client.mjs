// An MCP client built on the pinned TypeScript SDK, for Go tests that want a
// client that is not ours (mcpservetest.RunTSClient runs it).
//
//   node client.mjs URL [TOOL [ARGS_JSON]]
//
// Connects to URL over Streamable HTTP, lists the tools, calls TOOL with
// ARGS_JSON (an object; {} when omitted) when given, and prints one JSON line:
//
//   {"serverInfo":…, "protocolVersion":…, "capabilities":…, "sessionId":…,
//    "tools":["name",…], "toolList":[…], "call":{…},
//    "elicitations":[{params…}], "samplings":[{params…}], "notifications":[…]}
//
// Environment:
//   MCP_HEADERS    JSON object of HTTP headers sent on every request
//                  (e.g. {"Authorization":"Bearer …"}).
//   ELICIT_ANSWER  JSON: the answer to elicitation/create requests,
//                  {"action":"accept","content":{…}}, or an array of them
//                  used in order (the last one repeats). When set, the
//                  client declares the elicitation capability; when unset it
//                  declares none, so a server must not ask.
//   SAMPLE_ANSWER  text the client answers sampling/createMessage with;
//                  when set, the client declares the sampling capability.
//
// On failure it prints {"error":{"message":…,"code":…}, …what it had so far}
// on stdout, the message on stderr, and exits 1. A tool result with
// isError:true is not a failure: it is in "call".
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  LoggingMessageNotificationSchema
} from '@modelcontextprotocol/sdk/types.js';

function parseJSONEnv(name) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return undefined;
  try {
    return JSON.parse(raw);
  } catch (err) {
    throw new Error(`${name} is not JSON: ${err.message}`);
  }
}

const out = { tools: [], elicitations: [], samplings: [], notifications: [] };

async function main() {
  const [url, tool, argsJSON] = process.argv.slice(2);
  if (!url) throw new Error('usage: node client.mjs URL [TOOL [ARGS_JSON]]');
  const headers = parseJSONEnv('MCP_HEADERS') ?? {};
  const elicitAnswer = parseJSONEnv('ELICIT_ANSWER');
  const sampleAnswer = process.env.SAMPLE_ANSWER;
  let args = {};
  if (argsJSON) {
    try {
      args = JSON.parse(argsJSON);
    } catch (err) {
      throw new Error(`tool arguments are not JSON: ${err.message}`);
    }
  }

  const capabilities = {};
  if (elicitAnswer !== undefined) capabilities.elicitation = {};
  if (sampleAnswer !== undefined) capabilities.sampling = {};
  const client = new Client({ name: 'mcpservetest-ts-client', version: '1.0.0' }, { capabilities });

  if (elicitAnswer !== undefined) {
    const answers = Array.isArray(elicitAnswer) ? elicitAnswer : [elicitAnswer];
    let next = 0;
    client.setRequestHandler(ElicitRequestSchema, async (request) => {
      out.elicitations.push(request.params);
      const answer = answers[Math.min(next, answers.length - 1)];
      next++;
      return answer;
    });
  }
  if (sampleAnswer !== undefined) {
    client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
      out.samplings.push(request.params);
      return {
        role: 'assistant',
        content: { type: 'text', text: sampleAnswer },
        model: 'mcpservetest-scripted',
        stopReason: 'endTurn'
      };
    });
  }
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    out.notifications.push({ method: n.method, params: n.params });
  });

  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport);
  out.serverInfo = client.getServerVersion();
  out.capabilities = client.getServerCapabilities();
  out.protocolVersion = transport.protocolVersion;
  out.sessionId = transport.sessionId;

  const listed = await client.listTools();
  out.toolList = listed.tools;
  out.tools = listed.tools.map((t) => t.name);

  if (tool) {
    out.call = await client.callTool(
      { name: tool, arguments: args },
      undefined,
      // Asking for progress sends a progress token; the SDK hands the
      // notifications to onprogress, not to a notification handler.
      { onprogress: (progress) => out.notifications.push({ method: 'notifications/progress', params: progress }) }
    );
  }
  await client.close();
}

main().then(
  () => {
    process.stdout.write(JSON.stringify(out) + '\n');
    process.exit(0);
  },
  (err) => {
    out.error = { message: err?.message ?? String(err) };
    if (err?.code !== undefined) out.error.code = err.code;
    if (err?.data !== undefined) out.error.data = err.data;
    process.stdout.write(JSON.stringify(out) + '\n');
    process.stderr.write(`client.mjs: ${out.error.message}\n`);
    process.exit(1);
  }
);
