// The console's sandbox page: what the sandbox is, its lifecycle actions, its
// events (a timeline with reasons, kept current), its processes and their
// output, a command line (an exec through the API), and a file browser
// (list, download, upload) with the API's path confinement, and a terminal.
"use strict";

const SANDBOX = document.querySelector('meta[name="sandbox"]').content;
const base = "sandboxes/" + encodeURIComponent(SANDBOX);
let current = null;

function fact(dl, term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  dl.append(dt, dd);
}

function showSandbox(sb) {
  current = sb;
  const st = document.getElementById("state");
  st.className = "state " + sb.state;
  st.textContent = sb.state;
  const dl = document.getElementById("facts");
  dl.replaceChildren();
  fact(dl, "Tier", sb.runtime || "namespace");
  fact(dl, "Image", sb.source);
  fact(dl, "Tenant", sb.tenant);
  fact(dl, "Lifecycle", sb.lifecycle + (sb.policy ? ` · on idle ${sb.policy.on_idle} after ${sb.policy.idle_timeout}` : ""));
  fact(dl, "Created", `${sb.created_at} (${age(sb.created_at)} ago)`);
  const lim = sb.limits || {};
  const limit = (b) => (b ? bytes(b) : "none");
  fact(dl, "Limits", `memory ${limit(lim.memory_bytes)} · cpus ${lim.cpus || "none"} · disk ${limit(lim.disk_bytes)} · pids ${lim.pids || "none"}`);
  if (sb.base_checkpoint) fact(dl, "From checkpoint", sb.base_checkpoint);
  if (sb.head_checkpoint) fact(dl, "Last checkpoint", sb.head_checkpoint);
  fact(dl, "Fork generation", String(sb.fork_generation || 0));
  const labels = Object.entries(sb.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
  if (labels) fact(dl, "Labels", labels);
  if ((sb.secrets || []).length) fact(dl, "Secrets (names)", sb.secrets.map((s) => s.name || s).join(", "));
  if ((sb.capabilities || []).length) fact(dl, "Rule of Two", sb.capabilities.map((c) => `${c.capability} (${c.because})`).join("; "));
  if (sb.state_detail) fact(dl, "Reason", `${sb.state_reason}: ${sb.state_detail}`);
  const key = sb.state;
  const actions = document.getElementById("actions");
  if (actions.dataset.state === key) return;
  actions.dataset.state = key;
  actions.replaceChildren();
  actionButtons(actions, sb, (action, ok) => {
    if (action === "destroy" && ok) location.href = "/ui/fleet";
    else refresh();
  });
}

let lastEvent = 0;
function showEvents(events) {
  const ol = document.getElementById("events");
  for (const ev of events) {
    lastEvent = Math.max(lastEvent, ev.seq);
    const li = document.createElement("li");
    li.dataset.seq = ev.seq;
    const when = document.createElement("time");
    when.textContent = ev.time.replace("T", " ").replace(/\.\d+/, "");
    const what = document.createElement("span");
    what.className = "what";
    what.textContent = `${ev.from ? ev.from + " → " : ""}${ev.to}`;
    const why = document.createElement("span");
    why.className = "why";
    why.textContent = ev.reason + (ev.detail ? ": " + ev.detail : "") + (ev.duration_ms ? ` (${ev.duration_ms} ms)` : "");
    li.append(when, what, why);
    ol.prepend(li);
  }
}

async function showLogs(p) {
  const r = await fetch(`/ui/api/${base}/processes/${p.id}/logs`, { credentials: "same-origin" });
  const out = document.getElementById("logs");
  if (!r.ok) { out.textContent = `${r.status} ${await r.text()}`; return; }
  let text = "";
  for (const line of (await r.text()).split("\n")) {
    if (!line) continue;
    const ev = JSON.parse(line);
    if (ev.type === "output") text += fromB64(ev.data_b64);
    if (ev.type === "dropped") text += `[${ev.bytes} bytes dropped]\n`;
  }
  out.textContent = `# ${p.cmd.join(" ")}\n` + text;
}

function showProcesses(list) {
  const body = document.querySelector("#processes tbody");
  const key = JSON.stringify(list.map((p) => [p.id, p.status, p.exit_code]));
  if (body.dataset.key === key) return;
  body.dataset.key = key;
  body.replaceChildren();
  for (const p of list.slice(-20).reverse()) {
    const row = body.insertRow();
    cell(row, String(p.id));
    cell(row, p.cmd.join(" "), "cmd");
    cell(row, p.status === "running" ? "running" : `exited ${p.exit_code ?? ""}${p.signal ? " (signal " + p.signal + ")" : ""}`);
    const b = button("output", "output");
    b.addEventListener("click", () => showLogs(p).catch(showError));
    row.insertCell().append(b);
  }
}

document.getElementById("run").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const command = document.getElementById("command").value;
  if (!command.trim()) return;
  const out = document.getElementById("output");
  out.textContent = "running…";
  try {
    const r = await api("POST", `${base}/exec`, { cmd: ["sh", "-c", command], timeout: "60s" });
    const code = r.process.exit_code;
    out.textContent = `$ ${command}\n${fromB64(r.stdout_b64)}${fromB64(r.stderr_b64)}` + (code === 0 ? "" : `[exit ${code ?? "signal " + r.process.signal}]`);
    out.dataset.exit = String(code);
    showError(null);
  } catch (e) {
    out.textContent = "";
    showError(e);
  }
  refresh();
});

function join(dir, name) {
  return (dir.endsWith("/") ? dir : dir + "/") + name;
}

async function list(path) {
  try {
    const entries = await api("GET", `${base}/files/list?path=${encodeURIComponent(path)}`);
    document.getElementById("path").value = path;
    const body = document.querySelector("#files tbody");
    body.replaceChildren();
    if (path !== "/") {
      const up = body.insertRow();
      const a = document.createElement("a");
      a.href = "#";
      a.textContent = "..";
      a.addEventListener("click", (e) => { e.preventDefault(); list(path.replace(/\/[^/]+\/?$/, "") || "/"); });
      up.insertCell().append(a);
      up.insertCell(); up.insertCell(); up.insertCell();
    }
    for (const f of entries.sort((x, y) => x.name.localeCompare(y.name))) {
      const row = body.insertRow();
      row.dataset.name = f.name;
      const a = document.createElement("a");
      a.textContent = f.name + (f.kind === "dir" ? "/" : "");
      if (f.kind === "dir") {
        a.href = "#";
        a.addEventListener("click", (e) => { e.preventDefault(); list(join(path, f.name)); });
      } else {
        // A download is a plain link: the console's API path, with the session's cookie.
        a.href = `/ui/api/${base}/files?path=${encodeURIComponent(join(path, f.name))}`;
        a.setAttribute("download", f.name);
      }
      row.insertCell().append(a);
      cell(row, f.kind + (f.link_target ? " → " + f.link_target : ""));
      cell(row, f.kind === "file" ? String(f.size) : "");
      cell(row, (f.mode & 0o7777).toString(8));
    }
    showError(null);
  } catch (e) {
    showError(e);
  }
}

document.getElementById("browse").addEventListener("submit", (ev) => {
  ev.preventDefault();
  list(document.getElementById("path").value || "/");
});

document.getElementById("upload").addEventListener("change", async (ev) => {
  const file = ev.target.files[0];
  if (!file) return;
  const dest = join(document.getElementById("path").value || "/", file.name);
  const r = await fetch(`/ui/api/${base}/files?path=${encodeURIComponent(dest)}`, {
    method: "PUT",
    credentials: "same-origin",
    headers: { "X-Strata-CSRF": csrf, "Content-Type": "application/octet-stream" },
    body: file,
  });
  if (r.ok) {
    showError(null);
  } else {
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    const e = new Error((body && body.message) || r.statusText);
    e.status = r.status;
    e.body = body;
    showError(e);
  }
  ev.target.value = "";
  list(document.getElementById("path").value || "/");
});

// A shell on a new terminal in the sandbox (`POST .../processes` with a
// `tty`), attached over the API's WebSocket: keys go out as binary frames,
// output comes back as binary frames; `exited` ends it.
const TERM_SIZE = { cols: 120, rows: 24 };
document.getElementById("terminal-open").addEventListener("click", async (ev) => {
  const button = ev.target;
  const state = document.getElementById("terminal-state");
  button.disabled = true;
  let proc;
  try {
    proc = await api("POST", `${base}/processes`, { cmd: ["sh"], tty: TERM_SIZE });
  } catch (e) {
    showError(e);
    button.disabled = false;
    return;
  }
  const box = document.getElementById("terminal");
  box.replaceChildren();
  const term = new Terminal({ cols: TERM_SIZE.cols, rows: TERM_SIZE.rows, convertEol: false, fontSize: 13 });
  term.open(box);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}/ui/api/${base}/processes/${proc.id}/tty?offset=0`);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  ws.onopen = () => {
    state.textContent = `process ${proc.id}, attached`;
    term.focus();
  };
  ws.onmessage = (m) => {
    if (typeof m.data !== "string") {
      term.write(new Uint8Array(m.data));
      return;
    }
    const msg = JSON.parse(m.data);
    if (msg.type === "exited") {
      state.textContent = `process ${proc.id} exited ${msg.process ? msg.process.exit_code ?? "" : ""}`;
      button.disabled = false;
    } else if (msg.type === "error" || msg.type === "dropped") {
      term.write(`\r\n[${msg.type}: ${msg.message || msg.bytes || ""}]\r\n`);
    }
  };
  ws.onclose = () => {
    button.disabled = false;
    if (!state.textContent.includes("exited")) state.textContent = `process ${proc.id}, detached`;
  };
  term.onData((d) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(d));
  });
});

const refresh = poll(async () => {
  try {
    showSandbox(await api("GET", base));
  } catch (e) {
    throw e.status === 404 && current ? { status: 404, message: "this sandbox is gone (destroyed)" } : e;
  }
  showEvents(await api("GET", `events?sandbox=${encodeURIComponent(SANDBOX)}&after=${lastEvent}`));
  showProcesses(await api("GET", `${base}/processes`));
}, 1000);
list("/");
