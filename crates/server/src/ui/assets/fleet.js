// The console's fleet page: the sandboxes the session's token may see, kept
// current (polled every second), filterable, with the lifecycle actions of each.
"use strict";

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
    strong.append(sandboxLink(sb));
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
    cell(row, "", "cpu");
    cell(row, "", "mem");
    cell(row, "", "disk");
    cell(row, sb.lifecycle || "");
    cell(row, Object.entries(sb.labels || {}).map(([k, v]) => `${k}=${v}`).join(" "));
    const actions = cell(row, "", "actions");
    actionButtons(actions, sb, () => refresh());
  }
  document.getElementById("count").textContent = `${shown.length} of ${list.length} sandboxes`;
}

// The live figures (sampled every few seconds), written into their cells in place.
function showStats(stats) {
  const byId = new Map(stats.map((s) => [s.sandbox_id, s]));
  for (const row of document.querySelectorAll("#fleet tbody tr")) {
    const s = byId.get(row.dataset.id);
    const set = (cls, text) => { row.querySelector("td." + cls).textContent = text; };
    if (!s) { set("cpu", ""); set("mem", ""); set("disk", ""); continue; }
    set("cpu", `${s.cpu_core_pct.toFixed(1)}%`);
    set("mem", bytes(s.memory_bytes) + (s.memory_limit_bytes ? ` / ${bytes(s.memory_limit_bytes)}` : ""));
    set("disk", bytes(s.disk_bytes) + (s.disk_limit_bytes ? ` / ${bytes(s.disk_limit_bytes)}` : ""));
  }
}

const refresh = poll(async () => {
  render(await api("GET", "sandboxes"));
  showStats(await api("GET", "stats"));
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}, 1000);

document.getElementById("filter-state").addEventListener("change", refresh);
document.getElementById("filter-label").addEventListener("input", refresh);
