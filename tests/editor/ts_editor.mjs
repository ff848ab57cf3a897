// An editor written with the official TypeScript ACP SDK (@agentclientprotocol/sdk): initialize,
// session/new, pick the provider through the config option, one prompt. Prints one JSON line:
// {init, configOptions, stopReason, text, updates}.
//
//   node ts_editor.mjs <sdk node_modules> stdio <cwd> <provider> <prompt> -- <bridge argv...>
//   node ts_editor.mjs <sdk node_modules> ws    <cwd> <provider> <prompt> <url> <token>
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, mode, cwd, provider, prompt, ...rest] = process.argv.slice(2);
const require = createRequire(path.join(modules, "noop.js"));
const acp = await import(require.resolve("@agentclientprotocol/sdk"));

let stream, child;
if (mode === "stdio") {
  const argv = rest.slice(rest.indexOf("--") + 1);
  child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
} else {
  const [url, token] = rest;
  const { createWebSocketStream } = await import(require.resolve("@agentclientprotocol/sdk/experimental/ws-client"));
  const { WebSocket } = require("ws");
  stream = createWebSocketStream(url, { WebSocket, headers: { Authorization: `Bearer ${token}` } });
}

const updates = [];
const app = acp.client().onNotification("session/update", (cx) => {
  updates.push(cx.params);
});
const connection = app.connect(stream);
const agent = connection.agent;
const init = await agent.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
const session = await agent.request("session/new", { cwd, mcpServers: [] });
const chosen = await agent.request("session/set_config_option", {
  sessionId: session.sessionId,
  configId: "provider",
  value: provider,
});
const answer = await agent.request("session/prompt", {
  sessionId: session.sessionId,
  prompt: [{ type: "text", text: prompt }],
});
const text = updates
  .filter((u) => u.update.sessionUpdate === "agent_message_chunk")
  .map((u) => u.update.content.text)
  .join("");
process.stdout.write(
  JSON.stringify({
    init,
    configOptions: chosen.configOptions,
    stopReason: answer.stopReason,
    text,
    updates: updates.map((u) => u.update.sessionUpdate),
  }) + "\n",
);
connection.close();
if (child) child.stdin.end();
process.exit(0);
