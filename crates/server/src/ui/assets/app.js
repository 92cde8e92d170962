// What every page of the console shares: the native API called through the
// console (/ui/api, with the session's token on the server side and the
// page's CSRF token on changes), the lifecycle actions of a sandbox, errors
// shown as the API gives them (a 409 with the current state), logout.
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

// A button that names its action (`data-action`, what the tests click).
function button(text, action, cls) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.dataset.action = action;
  if (cls) b.className = cls;
  return b;
}

// A size in bytes, KiB, MiB, GiB or TiB.
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

// Buttons for the actions a sandbox in its state offers, into `container`;
// `then(action, ok)` runs after each click's call (an error is shown).
function actionButtons(container, sb, then) {
  for (const a of ACTIONS[sb.state] || []) {
    const b = button(a, a, a === "destroy" ? "danger" : "");
    b.addEventListener("click", async () => {
      b.disabled = true;
      let ok = false;
      try {
        const done = act(sb, a);
        if (done) { await done; showError(null); ok = true; }
      } catch (e) {
        showError(e);
      } finally {
        b.disabled = false;
        then(a, ok);
      }
    });
    container.append(b);
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

// Shows an API error (or clears it) in the page's #error line.
function showError(e) {
  const el = document.getElementById("error");
  if (!e) { el.textContent = ""; return; }
  const state = e.body && e.body.current_state ? ` (it is ${e.body.current_state})` : "";
  const code = e.body && e.body.code ? `${e.body.code}: ` : "";
  el.textContent = `${e.status || ""} ${code}${e.message}${state}`.trim();
}

// Runs `load` now and every `ms` milliseconds, never two at once; an API
// error it meets is shown. Returns the function that runs it again at once.
function poll(load, ms) {
  let busy = false;
  const run = async () => {
    if (busy) return;
    busy = true;
    try {
      await load();
    } catch (e) {
      if (e.status) showError(e);
    } finally {
      busy = false;
    }
  };
  run();
  setInterval(run, ms);
  return run;
}

// An amount of money as the cost model gives it (a short run costs
// millionths: those keep three significant digits).
function money(x) {
  if (!x) return "0";
  return Math.abs(x) < 0.01 ? x.toPrecision(3) : x.toFixed(4);
}

// The text of base64 bytes (UTF-8, invalid sequences replaced).
function fromB64(b64) {
  const bin = atob(b64 || "");
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new TextDecoder().decode(bytes);
}

// The link of a sandbox's page, with its name (or id) as the text.
function sandboxLink(sb) {
  const a = document.createElement("a");
  a.href = "/ui/sandboxes/" + encodeURIComponent(sb.id);
  a.textContent = sb.name || sb.id;
  a.className = "sandbox-link";
  return a;
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin", headers: { "X-Strata-CSRF": csrf } });
  location.href = "/ui/login";
});
