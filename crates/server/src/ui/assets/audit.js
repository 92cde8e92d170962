// The console's audit page: the audit log (newest first) and whether its hash
// chain verifies (`GET /v1/audit/verify`), kept current.
"use strict";

let drawn = null;
function render(entries, verification) {
  const v = document.getElementById("verify");
  v.className = "verify " + (verification.ok ? "ok" : "broken");
  v.textContent = verification.ok
    ? `chain verified: ${verification.entries} entries`
    : `chain BROKEN at entry ${verification.first_bad}: ${verification.reason || ""}`;
  const key = JSON.stringify(entries.map((e) => e.seq));
  if (key === drawn) return;
  drawn = key;
  const body = document.querySelector("#audit tbody");
  body.replaceChildren();
  for (const e of entries.slice().reverse()) {
    const row = body.insertRow();
    row.dataset.seq = e.seq;
    cell(row, String(e.seq));
    cell(row, e.time.replace("T", " ").replace(/\.\d+/, ""));
    cell(row, e.actor);
    cell(row, e.tenant || "");
    cell(row, `${e.method} ${e.route}`, "cmd");
    cell(row, e.target || "");
    cell(row, String(e.status), e.status >= 400 ? "status bad" : "status");
  }
}

const refresh = poll(async () => {
  const limit = document.getElementById("limit").value;
  const [entries, verification] = await Promise.all([api("GET", `audit?limit=${limit}`), api("GET", "audit/verify")]);
  render(entries, verification);
}, 2000);

document.getElementById("limit").addEventListener("change", () => { drawn = null; refresh(); });
