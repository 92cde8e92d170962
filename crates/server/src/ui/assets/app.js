// The console's fleet page: the sandboxes the session's token may see, kept
// current (polled every second through /ui/api, which is the native API
// called with the session's token), with the lifecycle actions of each.
"use strict";

const csrf = document.querySelector('meta[name="csrf"]').content;

// Calls the native API through the console; an ended session goes back to the login.
async function api(method, path, body) {
  const r = await fetch("/ui/api/" + path, {
    method,
    credentials: "same-origin",
    headers: Object.assign({ "X-Strata-CSRF": csrf }, body ? { "Content-Type": "application/json" } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  if (r.status === 401) {
    location.href = "/ui/login?expired=1";
    throw new Error("session ended");
  }
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (!r.ok) {
    const e = new Error((json && json.message) || r.statusText);
    e.status = r.status;
    e.body = json;
    throw e;
  }
  return json;
}

// Which actions a sandbox in `state` offers (the API refuses the rest with a 409).
const ACTIONS = {
  running: ["stop", "standby", "pause", "checkpoint", "fork", "destroy"],
  paused: ["unpause", "stop", "destroy"],
  standby: ["resume", "archive", "destroy"],
  stopped: ["start", "checkpoint", "fork", "archive", "destroy"],
  archived: ["start", "destroy"],
  error: ["start", "destroy"],
  lost: ["destroy"],
  creating: [],
};

function act(sb, action) {
  const id = encodeURIComponent(sb.id);
  switch (action) {
    case "destroy":
      if (!confirm(`Destroy sandbox ${sb.name || sb.id}? Its files and processes are gone for good.`)) return null;
      return api("DELETE", `sandboxes/${id}?force=true`);
    case "checkpoint":
      return api("POST", `sandboxes/${id}/checkpoints`, {});
    case "fork":
      return api("POST", "fork", { source: sb.id, count: 1 });
    default:
      return api("POST", `sandboxes/${id}/${action}`, action === "standby" ? {} : undefined);
  }
}

function age(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function cell(row, text, cls) {
  const td = row.insertCell();
  if (cls) td.className = cls;
  td.textContent = text;
  return td;
}

function showError(e) {
  const el = document.getElementById("error");
  if (!e) { el.textContent = ""; return; }
  const state = e.body && e.body.current_state ? ` (it is ${e.body.current_state})` : "";
  const code = e.body && e.body.code ? `${e.body.code}: ` : "";
  el.textContent = `${e.status || ""} ${code}${e.message}${state}`.trim();
}

function matches(sb) {
  const state = document.getElementById("filter-state").value;
  const label = document.getElementById("filter-label").value.trim();
  if (state && sb.state !== state) return false;
  if (label) {
    const [k, v] = label.split("=");
    const have = (sb.labels || {})[k];
    if (have === undefined || (v !== undefined && have !== v)) return false;
  }
  return true;
}

// What the table shows now: it is drawn again only when that changes (a
// click on a row's button is never lost to a redraw that changed nothing).
let drawn = null;

function render(list) {
  const body = document.querySelector("#fleet tbody");
  const shown = list.filter(matches);
  const key = JSON.stringify([shown.map((sb) => [sb.id, sb.name, sb.tenant, sb.state, sb.runtime, sb.source, sb.lifecycle, sb.labels]), list.length]);
  if (key === drawn) {
    // Only the ages move: their cells are updated in place.
    for (const td of body.querySelectorAll("td.age")) td.textContent = age(td.dataset.created);
    return;
  }
  drawn = key;
  body.replaceChildren();
  for (const sb of shown) {
    const row = body.insertRow();
    row.dataset.id = sb.id;
    const name = cell(row, "", "id");
    const strong = document.createElement("strong");
    strong.textContent = sb.name || "";
    const code = document.createElement("code");
    code.textContent = " " + sb.id;
    name.append(strong, code);
    cell(row, sb.tenant || "");
    const st = cell(row, "");
    const badge = document.createElement("span");
    badge.className = "state " + sb.state;
    badge.textContent = sb.state;
    st.append(badge);
    cell(row, sb.runtime || "namespace");
    cell(row, sb.source);
    cell(row, age(sb.created_at), "age").dataset.created = sb.created_at;
    cell(row, sb.lifecycle || "");
    cell(row, Object.entries(sb.labels || {}).map(([k, v]) => `${k}=${v}`).join(" "));
    const actions = cell(row, "", "actions");
    for (const a of ACTIONS[sb.state] || []) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = a;
      b.dataset.action = a;
      if (a === "destroy") b.className = "danger";
      b.addEventListener("click", async () => {
        b.disabled = true;
        try {
          const done = act(sb, a);
          if (done) { await done; showError(null); }
        } catch (e) {
          showError(e);
        } finally {
          b.disabled = false;
          refresh();
        }
      });
      actions.append(b);
    }
  }
  document.getElementById("count").textContent = `${shown.length} of ${list.length} sandboxes`;
}

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    render(await api("GET", "sandboxes"));
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.status) showError(e);
  } finally {
    busy = false;
  }
}

document.getElementById("filter-state").addEventListener("change", refresh);
document.getElementById("filter-label").addEventListener("input", refresh);
document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin", headers: { "X-Strata-CSRF": csrf } });
  location.href = "/ui/login";
});
refresh();
setInterval(refresh, 1000);
