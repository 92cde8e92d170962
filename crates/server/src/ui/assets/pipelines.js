// The console's pipelines page: every run with a per-stage timeline (when each
// stage ran, how long its commands took and strata's share of it, the state
// it kept and what it cost, a fan-out's winner and losers), live while it
// runs, with pause and resume.
"use strict";

function seconds(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${ms} ms`;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function fanoutText(f) {
  if (!f) return "";
  const parts = f.attempts.map((a) => {
    const won = f.winner === a.index;
    return `${won ? "★ " : ""}#${a.index} ${a.outcome}${a.exit_code !== undefined && a.exit_code !== null ? " (exit " + a.exit_code + ")" : ""}${a.score !== undefined && a.score !== null ? " score " + a.score : ""}`;
  });
  return `fan-out of ${f.attempts.length}: ${parts.join(", ")}${f.winner === undefined || f.winner === null ? " — no winner" + (f.reason ? ": " + f.reason : "") : ""}`;
}

function runCard(run) {
  const card = el("section", "card run");
  card.dataset.id = run.id;
  const h = el("h3");
  const badge = el("span", "state " + run.state, run.state);
  h.append(`${run.name} `, el("code", "", run.id), " ", badge);
  const actions = el("span", "actions");
  for (const [verb, when] of [["pause", "running"], ["resume", "paused"], ["resume", "interrupted"]]) {
    if (run.state !== when) continue;
    const b = button(verb, verb);
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        await api("POST", `pipelines/${encodeURIComponent(run.id)}/${verb}`);
        showError(null);
      } catch (e) {
        showError(e);
      } finally {
        refresh();
      }
    });
    actions.append(b);
  }
  h.append(" ", actions);
  card.append(h);
  if (run.reason) card.append(el("p", "hint", run.reason));
  const t0 = Date.parse(run.created_at);
  const ends = run.stages.map((s) => (s.finished_at ? Date.parse(s.finished_at) : s.started_at ? Date.now() : t0));
  const span = Math.max(1, ...ends.map((e) => e - t0));
  const table = el("table", "stages");
  const head = table.createTHead().insertRow();
  for (const t of ["Stage", "Lifecycle", "Time line", "Wall (commands)", "State kept", "Cost", "Outcome"]) head.append(el("th", "", t));
  const body = table.createTBody();
  for (const s of run.stages) {
    const row = body.insertRow();
    row.dataset.stage = s.name;
    row.insertCell().append(el("strong", "", s.name));
    row.insertCell().append(el("span", "", s.lifecycle));
    const line = el("div", "timeline-bar");
    if (s.started_at) {
      const start = Date.parse(s.started_at) - t0;
      const end = (s.finished_at ? Date.parse(s.finished_at) : Date.now()) - t0;
      const bar = el("div", "bar " + s.state);
      bar.style.left = `${(100 * start) / span}%`;
      bar.style.width = `${Math.max(0.5, (100 * (end - start)) / span)}%`;
      if (s.duration_ms) {
        const cmd = el("div", "commands");
        cmd.style.width = `${Math.min(100, (100 * s.commands_ms) / s.duration_ms)}%`;
        bar.append(cmd);
      }
      line.append(bar);
    }
    row.insertCell().append(line);
    row.insertCell().append(el("span", "", s.started_at ? `${seconds(s.duration_ms)} (${seconds(s.commands_ms)})` : "—"));
    row.insertCell().append(el("span", "", bytes(s.state_kept_bytes)));
    row.insertCell().append(el("span", "", money(s.cost)));
    const out = [s.state];
    if (s.exit_codes && s.exit_codes.length) out.push(`exits ${s.exit_codes.join(",")}`);
    if (s.template) out.push(`template ${s.template}`);
    if (s.checkpoint) out.push(`checkpoint ${s.checkpoint}`);
    if (s.output_sandbox) out.push(`standby ${s.output_sandbox}`);
    const fan = fanoutText(s.fanout);
    if (fan) out.push(fan);
    for (const n of s.notes || []) out.push(n);
    if (s.error) out.push(s.error);
    row.insertCell().append(el("span", "outcome", out.join(" · ")));
  }
  card.append(table);
  return card;
}

let drawn = null;
function render(runs) {
  document.getElementById("count").textContent = `${runs.length} runs`;
  const key = JSON.stringify(runs.map((r) => [r.id, r.state, r.updated_at, r.stages.map((s) => [s.state, s.finished_at])]));
  const running = runs.some((r) => r.state === "running");
  if (key === drawn && !running) return;
  drawn = key;
  const box = document.getElementById("runs");
  box.replaceChildren(...runs.map(runCard));
}

const refresh = poll(async () => {
  render(await api("GET", "pipelines"));
}, 1000);

