// The console's lineage page: the tree of images, checkpoints, sandboxes,
// forks and templates around one sandbox or checkpoint (`GET /v1/lineage`),
// drawn as a graph, kept current; from a node: fork N, restore, promote to
// a template (the scan gate's findings shown), delete (refused with what
// still depends on it).
"use strict";

const FOCUS = document.querySelector('meta[name="focus"]').content;
const SVG = "http://www.w3.org/2000/svg";
const W = 190, H = 58, GAP_X = 24, GAP_Y = 56;
let nodes = [];
let selected = null;

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

// Leaves take the next column; a parent sits above the middle of its children.
function layout(list) {
  const byId = new Map(list.map((n) => [n.id, n]));
  const children = new Map(list.map((n) => [n.id, []]));
  const roots = [];
  for (const n of list) {
    if (n.parent && byId.has(n.parent)) children.get(n.parent).push(n);
    else roots.push(n);
  }
  const pos = new Map();
  let next = 0;
  let depthMax = 0;
  const place = (n, depth) => {
    depthMax = Math.max(depthMax, depth);
    const kids = children.get(n.id);
    let x;
    if (!kids.length) {
      x = next++;
    } else {
      const xs = kids.map((k) => place(k, depth + 1));
      x = (xs[0] + xs[xs.length - 1]) / 2;
    }
    pos.set(n.id, { x, y: depth });
    return x;
  };
  for (const r of roots) place(r, 0);
  return { pos, columns: Math.max(1, next), rows: depthMax + 1 };
}

function draw(list) {
  const { pos, columns, rows } = layout(list);
  const width = columns * (W + GAP_X) + GAP_X;
  const height = rows * (H + GAP_Y) + GAP_Y / 2;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  const at = (id) => {
    const p = pos.get(id);
    return { x: GAP_X + p.x * (W + GAP_X), y: GAP_Y / 2 + p.y * (H + GAP_Y) };
  };
  for (const n of list) {
    if (!n.parent || !pos.has(n.parent)) continue;
    const a = at(n.parent), b = at(n.id);
    const path = `M${a.x + W / 2},${a.y + H} C${a.x + W / 2},${a.y + H + GAP_Y / 2} ${b.x + W / 2},${b.y - GAP_Y / 2} ${b.x + W / 2},${b.y}`;
    root.append(svg("path", { d: path, class: "edge" }));
  }
  for (const n of list) {
    const p = at(n.id);
    const g = svg("g", { class: `node ${n.kind}${n.id === FOCUS ? " focus" : ""}${selected === n.id ? " selected" : ""}`, transform: `translate(${p.x},${p.y})`, tabindex: 0 });
    g.dataset.id = n.id;
    g.dataset.kind = n.kind;
    if (n.parent) g.dataset.parent = n.parent;
    g.append(svg("rect", { width: W, height: H, rx: 6 }));
    const title = svg("text", { x: 10, y: 20, class: "name" });
    title.textContent = n.name.length > 17 ? n.name.slice(0, 16) + "…" : n.name;
    const kind = svg("text", { x: W - 10, y: 20, class: "kind", "text-anchor": "end" });
    kind.textContent = n.kind;
    const detail = svg("text", { x: 10, y: 42, class: "detail" });
    detail.textContent = n.detail.length > 28 ? n.detail.slice(0, 27) + "…" : n.detail;
    const tip = svg("title");
    tip.textContent = `${n.kind} ${n.name} (${n.id})\n${n.detail}`;
    g.append(title, kind, detail, tip);
    g.addEventListener("click", () => select(n.id));
    root.append(g);
  }
  const box = document.getElementById("graph");
  box.replaceChildren(root);
  // The node asked about in view.
  if (pos.has(FOCUS)) box.scrollLeft = Math.max(0, at(FOCUS).x + W / 2 - box.clientWidth / 2);
}

// Runs an API call from the panel; its error (with dependents or findings) is shown.
async function attempt(call) {
  try {
    await call();
    showError(null);
  } catch (e) {
    // The API's message names what still depends on it; a scan's findings are listed.
    const findings = (e.body && e.body.findings) || [];
    const listed = findings.map((f) => `${f.rule} ${f.path}`).join("; ");
    showError(listed ? Object.assign(e, { message: `${e.message} (findings: ${listed})` }) : e);
  }
  refresh();
}

function select(id) {
  selected = id;
  const n = nodes.find((x) => x.id === id);
  const panel = document.getElementById("panel");
  panel.replaceChildren();
  if (!n) { panel.append("Select a node."); return; }
  const h = document.createElement("h3");
  h.textContent = `${n.kind} ${n.name}`;
  const code = document.createElement("code");
  code.textContent = n.id;
  const detail = document.createElement("p");
  detail.textContent = n.detail;
  panel.append(h, code, detail);
  const actions = document.createElement("div");
  actions.className = "actions";
  const enc = encodeURIComponent(n.id);
  if (n.kind === "checkpoint") {
    const count = document.createElement("input");
    count.type = "number";
    count.min = "1";
    count.max = "64";
    count.value = "1";
    count.id = "fork-count";
    const fork = button("fork", "fork");
    fork.addEventListener("click", () => attempt(() => api("POST", "fork", { source: n.id, count: Number(count.value) || 1 })));
    const promote = button("promote to template", "promote");
    promote.addEventListener("click", () => {
      const name = prompt("Template name:", n.name + "-template");
      if (name) attempt(() => api("POST", "templates", { name, from: n.id }));
    });
    const del = button("delete", "delete", "danger");
    del.addEventListener("click", () => {
      if (confirm(`Delete checkpoint ${n.name}?`)) attempt(() => api("DELETE", `checkpoints/${enc}`));
    });
    actions.append(count, fork, promote, del);
    const focusNode = nodes.find((x) => x.id === FOCUS && x.kind === "sandbox");
    if (focusNode) {
      const restore = button(`restore ${focusNode.name} to it`, "restore");
      restore.addEventListener("click", () => {
        if (confirm(`Restore ${focusNode.name} to checkpoint ${n.name}? Its current files are replaced.`)) {
          attempt(() => api("POST", `sandboxes/${encodeURIComponent(FOCUS)}/restore`, { checkpoint: n.id }));
        }
      });
      actions.append(restore);
    }
  } else if (n.kind === "sandbox") {
    const open = document.createElement("a");
    open.href = "/ui/sandboxes/" + enc;
    open.textContent = "open its page";
    const ck = button("checkpoint", "checkpoint");
    ck.addEventListener("click", () => attempt(() => api("POST", `sandboxes/${enc}/checkpoints`, {})));
    actions.append(open, " ", ck);
  } else if (n.kind === "template") {
    const del = button("delete template", "delete", "danger");
    del.addEventListener("click", () => {
      if (confirm(`Delete template ${n.name}?`)) attempt(() => api("DELETE", `templates/${encodeURIComponent(n.name)}`));
    });
    actions.append(del);
  }
  panel.append(actions);
  for (const g of document.querySelectorAll("#graph g.node")) g.classList.toggle("selected", g.dataset.id === id);
}

let drawn = null;
const refresh = poll(async () => {
  const lineage = await api("GET", `lineage/${encodeURIComponent(FOCUS)}`);
  const key = JSON.stringify(lineage.nodes);
  if (key === drawn) return;
  drawn = key;
  nodes = lineage.nodes;
  draw(nodes);
  if (selected && nodes.some((n) => n.id === selected)) select(selected);
}, 2000);
