// The console's cost page: every sandbox's cost (destroyed ones too, from
// their usage records), charted against the two counterfactuals the cost
// model computes: nothing kept between stages, and compute never released.
"use strict";

function bar(label, value, max, cls) {
  const row = document.createElement("div");
  row.className = "chart-row";
  const name = document.createElement("span");
  name.className = "chart-label";
  name.textContent = label;
  const track = document.createElement("div");
  track.className = "chart-track";
  const fill = document.createElement("div");
  fill.className = "chart-fill " + cls;
  fill.style.width = `${max > 0 ? (100 * value) / max : 0}%`;
  track.append(fill);
  const v = document.createElement("span");
  v.className = "chart-value";
  v.textContent = money(value);
  row.append(name, track, v);
  return row;
}

let drawn = null;
function render(sum) {
  const key = JSON.stringify([sum.total, sum.ephemeral_only_total, sum.always_on_total, sum.sandboxes.length]);
  if (key === drawn) return;
  drawn = key;
  document.getElementById("totals").textContent =
    `total ${money(sum.total)} · ephemeral only ${money(sum.ephemeral_only_total)} · always on ${money(sum.always_on_total)} (${sum.prices.currency || ""})`;
  const chart = document.getElementById("chart");
  const max = Math.max(sum.total, sum.ephemeral_only_total, sum.always_on_total);
  chart.replaceChildren(
    bar("strata (actual)", sum.total, max, "actual"),
    bar("ephemeral only", sum.ephemeral_only_total, max, "ephemeral"),
    bar("always on", sum.always_on_total, max, "always"),
  );
  const body = document.querySelector("#cost tbody");
  body.replaceChildren();
  for (const r of sum.sandboxes.slice().reverse()) {
    const row = body.insertRow();
    row.dataset.id = r.sandbox_id;
    const name = row.insertCell();
    if (r.state === "destroyed") name.textContent = r.name;
    else name.append(sandboxLink({ id: r.sandbox_id, name: r.name }));
    cell(row, r.state);
    cell(row, `${Math.round(r.lifetime_seconds)} s`);
    cell(row, money(r.compute.total));
    cell(row, money(r.storage_total));
    cell(row, money(r.total), "num");
    cell(row, money(r.ephemeral_only.total), "num");
    cell(row, money(r.always_on.total), "num");
  }
}

const refresh = poll(async () => {
  render(await api("GET", "cost"));
}, 5000);

