// The first-run page of xworkmate-bridge (bridge/settings_page.py): no build step, no dependencies.
// The token is asked once and kept in this tab's sessionStorage; every text from the bridge is
// set with textContent, never as HTML.
"use strict";

const TOKEN_KEY = "xworkmate-bridge.token";
const $ = (id) => document.getElementById(id);
let registry = null; // the admin view (knowledge.sources.select {}), or null for a non-admin
let listing = []; // knowledge.sources entries

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function headers(json) {
  const h = {};
  if (token()) h.Authorization = "Bearer " + token();
  if (json) h["Content-Type"] = "application/json";
  return h;
}

class BridgeError extends Error {
  constructor(error, status) {
    super(error.message || "request failed (HTTP " + status + ")");
    this.code = error.code;
    this.reason = (error.data && (error.data.reason || error.data.code)) || "";
    this.status = status;
  }
}

async function api(method, path, body) {
  const init = { method, headers: headers(body !== undefined) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch("/settings/api/" + path, init);
  const data = await resp.json().catch(() => ({ error: { message: "not JSON (HTTP " + resp.status + ")" } }));
  if (!resp.ok || data.error) throw new BridgeError(data.error || {}, resp.status);
  return data;
}

let rpcId = 0;
async function rpc(method, params) {
  const body = { jsonrpc: "2.0", id: ++rpcId, method, params };
  const resp = await fetch("/acp/rpc", { method: "POST", headers: headers(true), body: JSON.stringify(body) });
  const data = await resp.json().catch(() => ({ error: { message: "not JSON (HTTP " + resp.status + ")" } }));
  if (data.error) throw new BridgeError(data.error, resp.status);
  return data.result;
}

function say(id, text, isError) {
  const el = $(id);
  el.textContent = text;
  el.classList.toggle("error", Boolean(isError));
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function registered(id) {
  return registry ? registry.sources.find((s) => s.id === id) : undefined;
}

function statusText(entry, reg) {
  if (reg && !reg.usable) return "not used (" + (reg.reason || "refused") + ")";
  if (!entry || !entry.enabled) return "not selected";
  if (entry.probed === false) return entry.registered ? "registered" : "configured";
  return entry.ready ? "ready" + (entry.pageCount != null ? " · " + entry.pageCount + " pages" : "") : "not ready (" + (entry.reason || "unknown") + ")";
}

function render() {
  const body = $("sources").tBodies[0];
  body.replaceChildren();
  const ids = listing.map((e) => e.id);
  for (const reg of registry ? registry.sources : []) if (!ids.includes(reg.id)) ids.push(reg.id);
  for (const id of ids) {
    const entry = listing.find((e) => e.id === id);
    const reg = registered(id);
    const row = body.insertRow();
    row.dataset.sourceId = id;
    const use = row.insertCell();
    if (reg) {
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = reg.enabled;
      box.title = "use this source in knowledge turns";
      box.addEventListener("change", selectSources);
      use.appendChild(box);
    }
    cell(row, id);
    cell(row, (entry && entry.label) || (reg && reg.label) || id);
    cell(row, (entry && entry.protocol) || (reg && reg.protocol) || "");
    cell(row, reg ? reg.url || reg.root || "" : "configured", "where");
    const status = statusText(entry, reg);
    cell(row, status, "source-status " + (status.startsWith("ready") ? "ready" : status.startsWith("not ") ? "error" : ""));
    const actions = row.insertCell();
    if (reg) {
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "Remove";
      remove.addEventListener("click", () => removeSource(id));
      actions.appendChild(remove);
    }
  }
  renderRuntime();
}

function renderRuntime() {
  if (!registry) {
    say("runtime-current", "Only an admin principal (adminPrincipals) can see and change the runtime.");
    return;
  }
  const rt = registry.runtime;
  if (rt.origin === "none") {
    say("runtime-current", "No runtime: answers are built from the evidence alone.");
  } else {
    const key = rt.apiKeyConfigured ? "an API key is stored on the bridge" : "no API key";
    say("runtime-current", "Runtime (" + rt.origin + "): " + rt.model + " at " + rt.baseUrl + "; " + key + ".");
  }
}

async function load(probe) {
  try {
    registry = await api("GET", "registry");
  } catch (err) {
    registry = null;
    if (err.status !== 403) say("token-status", err.message, true);
  }
  try {
    const result = await api("GET", "sources?probe=" + (probe ? 1 : 0));
    listing = result.sources.map((e) => ({ ...e, probed: result.probed }));
    say("token-status", token() ? "Token kept for this tab." : "No token: fine for a local bridge without tokens.");
  } catch (err) {
    listing = [];
    say("token-status", err.message, true);
  }
  render();
}

async function loadProviders() {
  try {
    const caps = await rpc("acp.capabilities", {});
    const ids = caps.providerCatalog.filter((p) => p.category === "knowledge" && p.enabled).map((p) => p.providerId);
    if (!ids.length) return;
    const select = $("provider");
    select.replaceChildren(...ids.map((id) => new Option(id, id)));
  } catch (err) {
    /* the default stays */
  }
}

async function addSource(event) {
  event.preventDefault();
  const protocol = $("add-protocol").value;
  const source = { id: $("add-id").value.trim(), protocol };
  if ($("add-label").value.trim()) source.label = $("add-label").value.trim();
  source[protocol === "local-wiki" ? "root" : "url"] = $("add-location").value.trim();
  say("add-status", "Adding " + source.id + "…");
  try {
    registry = await api("POST", "sources", { source, probe: true });
    const status = registry.source.status;
    const state = status ? (status.ready ? "ready" : "not ready (" + (status.reason || "unknown") + ")") : "added";
    say("add-status", "Added " + source.id + ": " + state + ".", status && !status.ready);
    $("add-form").reset();
    locationLabel();
  } catch (err) {
    say("add-status", err.message + (err.reason ? " (" + err.reason + ")" : ""), true);
  }
  await load(false);
}

async function selectSources() {
  const ids = [...document.querySelectorAll("#sources tbody tr")]
    .filter((row) => row.cells[0].firstChild && row.cells[0].firstChild.checked)
    .map((row) => row.dataset.sourceId);
  try {
    registry = await api("PUT", "selection", { sourceIds: ids });
  } catch (err) {
    say("add-status", err.message, true);
  }
  await load(false);
}

async function removeSource(id) {
  try {
    registry = await api("DELETE", "sources/" + encodeURIComponent(id));
    say("add-status", "Removed " + id + ".");
  } catch (err) {
    say("add-status", err.message, true);
  }
  await load(false);
}

async function saveRuntime(event) {
  event.preventDefault();
  const runtime = { baseUrl: $("runtime-url").value.trim(), model: $("runtime-model").value.trim() };
  if ($("runtime-key").value) runtime.apiKey = $("runtime-key").value;
  await setRuntime(runtime);
}

async function setRuntime(runtime) {
  try {
    registry = await api("PUT", "selection", { runtime });
    $("runtime-key").value = ""; // the key lives on the bridge now, not in the page
    say("runtime-status", runtime ? "Runtime saved." : "Runtime removed: evidence only.");
  } catch (err) {
    say("runtime-status", err.message + (err.reason ? " (" + err.reason + ")" : ""), true);
  }
  renderRuntime();
}

function citationText(c) {
  const page = c.pageId ? "/" + c.pageId : c.path || "";
  const where = [c.sourceId, page].filter(Boolean).join(": ");
  return (c.title || c.id || "?") + (where ? " (" + where + ")" : "");
}

async function ask(event) {
  event.preventDefault();
  const sessionId = "settings-" + Math.random().toString(36).slice(2, 12);
  const params = {
    sessionId,
    taskPrompt: $("question").value,
    routing: { routingMode: "explicit", explicitExecutionTarget: "agent", explicitProviderId: $("provider").value },
  };
  say("ask-status", "Asking…");
  $("answer").textContent = "";
  $("citations").replaceChildren();
  try {
    const result = await rpc("session.start", params);
    const artifact = (result.artifacts || []).find((a) => a && Array.isArray(a.citations)) || { citations: [] };
    $("answer").textContent = (result.output || "").replace(/\]\(#citation-(\d+)\)/g, "]");
    for (const c of artifact.citations) {
      const li = document.createElement("li");
      li.textContent = citationText(c);
      $("citations").appendChild(li);
    }
    const mode = artifact.orchestrationMode ? " · " + artifact.orchestrationMode : "";
    const failure = result.error ? ": " + result.error.code + " " + result.error.message : "";
    say("ask-status", (result.status || "done") + mode + failure, !result.success);
  } catch (err) {
    say("ask-status", err.message, true);
  } finally {
    rpc("session.close", { sessionId }).catch(() => {});
  }
}

function locationLabel() {
  const local = $("add-protocol").value === "local-wiki";
  $("add-location-label").textContent = local ? "Folder" : "URL";
  $("add-location").placeholder = local ? "/home/me/notes" : "http://127.0.0.1:8765";
}

function init() {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    load(false);
    loadProviders();
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    say("token-status", "Token forgotten.");
  });
  $("add-form").addEventListener("submit", addSource);
  $("add-protocol").addEventListener("change", locationLabel);
  $("test-sources").addEventListener("click", () => load(true));
  $("runtime-form").addEventListener("submit", saveRuntime);
  $("runtime-clear").addEventListener("click", () => setRuntime(null));
  $("ask-form").addEventListener("submit", ask);
  load(false);
  loadProviders();
}

init();
