// The console's approval queue: requests that would give one sandbox all three
// Rule-of-Two capabilities, live, with approve / deny and a reason. A decision
// is the API's (`POST /v1/approvals/{id}/approve|deny`), audited as the
// session's caller; an operator's token decides, a tenant's sees its own.
"use strict";

let drawn = null;

function render(list) {
  const body = document.querySelector("#approvals tbody");
  const key = JSON.stringify(list.map((a) => [a.id, a.state, a.decided_by, a.reason]));
  document.getElementById("count").textContent = `${list.length} shown`;
  if (key === drawn) return;
  drawn = key;
  body.replaceChildren();
  for (const a of list.slice().reverse()) {
    const row = body.insertRow();
    row.dataset.id = a.id;
    const asked = cell(row, "");
    const what = document.createElement("strong");
    what.textContent = `${a.action} ${a.target}`;
    const id = document.createElement("code");
    id.textContent = " " + a.id;
    asked.append(what, id);
    cell(row, `${a.requested_by} (${a.tenant}) · ${age(a.requested_at)} ago`);
    const caps = cell(row, "");
    const ul = document.createElement("ul");
    ul.className = "caps";
    for (const g of a.capabilities) {
      const li = document.createElement("li");
      const c = document.createElement("span");
      c.className = "cap";
      c.textContent = g.capability;
      li.append(c, " — " + g.because);
      ul.append(li);
    }
    caps.append(ul);
    const st = cell(row, "");
    const badge = document.createElement("span");
    badge.className = "state " + a.state;
    badge.textContent = a.state;
    st.append(badge);
    if (a.decided_by) st.append(` by ${a.decided_by}` + (a.reason ? `: ${a.reason}` : ""));
    cell(row, a.expires_at.replace("T", " ").replace(/\.\d+/, ""));
    const decide = cell(row, "", "actions");
    if (a.state !== "pending") continue;
    for (const verdict of ["approve", "deny"]) {
      const b = button(verdict, verdict, verdict === "deny" ? "danger" : "");
      b.addEventListener("click", async () => {
        const reason = prompt(`Reason to ${verdict} "${a.action} ${a.target}" (recorded with your name):`, "");
        if (reason === null) return;
        b.disabled = true;
        try {
          await api("POST", `approvals/${encodeURIComponent(a.id)}/${verdict}`, { reason: reason || undefined });
          showError(null);
        } catch (e) {
          showError(e);
        } finally {
          b.disabled = false;
          refresh();
        }
      });
      decide.append(b);
    }
  }
}

const refresh = poll(async () => {
  const state = document.getElementById("filter-state").value;
  render(await api("GET", "approvals" + (state ? `?state=${state}` : "")));
}, 1000);

document.getElementById("filter-state").addEventListener("change", () => { drawn = null; refresh(); });
