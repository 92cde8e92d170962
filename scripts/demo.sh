#!/usr/bin/env bash
# The stage-lifecycle demo, end to end, on a fresh Debian 12 machine (as root):
#
#   scripts/demo.sh
#
# Sets the host up (packages, CRIU, test images incl. the Debian+python image),
# builds strata, starts a private daemon, and walks one agent task through the
# stages strata gives different lifecycles:
#
#   setup      persistent sandbox: a venv with 241 pinned Python packages installed
#              from a local wheelhouse (scripts/build-wheelhouse.sh fetches it from
#              PyPI once) and a project (paid once), scanned and sealed into a template
#   execute    multi-step work in the same sandbox, with a checkpoint
#   fan-out    `strata fork --run`: 4 children of the checkpoint try a different
#              fix each, the first whose test passes is promoted (the sandbox is
#              restored to it), the others are destroyed
#   idle       standby: a running dev server's processes and memory go to disk,
#              CPU and RAM are released
#   follow-up  the next call resumes it with the dev server still running (setup
#              not repaid); a new task starts from the template
#   pipeline   the next task as a pipeline spec (examples/demo/pipeline.toml) from the
#              template: work with checkpoints, fork 4 and select, ephemeral eval
#   evaluate   ephemeral `strata run --rm --isolation gvisor`: clean start, nothing left behind
#              (and, with STRATA_DEMO_MICROVM=1, once more in a microVM: docs/microvm.md)
#
# and prints a table per stage (lifecycle, time, state kept, cost), the lifecycle
# advisor's view of the idle stage, the cost of every sandbox against the
# ephemeral-only and always-on counterfactuals, and the time saved against reinstalling.
set -euo pipefail

STRATA_PROG=demo
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
cd "$(dirname "$(readlink -f "$0")")/.."
[ "$(id -u)" -eq 0 ] || die "run as root (sandboxes need namespaces, mounts and cgroups)"

IMAGES=${STRATA_TEST_IMAGES:-/var/cache/strata/images}
scripts/setup-host.sh
scripts/build-test-images.sh --debian "$IMAGES"
WHEELHOUSE=${STRATA_WHEELHOUSE:-/var/cache/strata/wheelhouse}
scripts/build-wheelhouse.sh "$WHEELHOUSE"
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi
step "cargo build --release" cargo build --release --locked -p strata
step "build strata-init (static)" scripts/build-init.sh --locked
STRATA=$PWD/target/release/strata

WORK=$(mktemp -d /var/tmp/strata-demo.XXXXXX)
export STRATA_SOCKET=$WORK/strata.sock
# A TCP listener on loopback too: the web console (/ui) and the API with bearer tokens.
LISTEN=127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$STRATA" daemon --state-dir "$WORK/state" --listen "$LISTEN" >"$WORK/daemon.log" 2>&1 &
DAEMON=$!
cleanup() {
    if [ "${STRATA_DEMO_KEEP:-0}" = 1 ]; then
        note "the daemon stays up (STRATA_DEMO_KEEP=1): console http://$LISTEN/ui, token in $WORK/state/api-token; stop it with: kill $DAEMON"
        return
    fi
    for id in $("$STRATA" ps --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' 2>/dev/null); do
        "$STRATA" rm -f "$id" >/dev/null 2>&1 || true
    done
    kill "$DAEMON" 2>/dev/null || true
    wait "$DAEMON" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 200); do [ -S "$STRATA_SOCKET" ] && break; sleep 0.05; done
[ -S "$STRATA_SOCKET" ] || { cat "$WORK/daemon.log"; die "daemon did not start"; }

ms() { date +%s%3N; }
# Cost accrued by all sandboxes (destroyed ones included) so far; a stage's cost is the difference.
cost_now() { "$STRATA" cost --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])'; }
COST0=$(cost_now)
ROWS=()
row() {
    local c
    c=$(cost_now)
    ROWS+=("$(printf '%-10s | %-24s | %8s ms | %10s | %s' "$1" "$2" "$3" "$(python3 -c "print('%.2e' % max(0.0, $c - $COST0))")" "$4")")
    COST0=$c
}

echo
note "importing the Debian+python image (shown with its progress bar)"
"$STRATA" image import "$IMAGES/debian-python.tar.gz" --name debian-python --trusted
"$STRATA" image ls

echo
NPKG=$(grep -c '==' "$WHEELHOUSE/requirements.txt")
note "stage 1 · setup: persistent sandbox, a venv with $NPKG packages + a project (paid once)"
t=$(ms)
# Flush rules: the wheels and pip's cache are wiped before every checkpoint, fork and template.
DEV=$("$STRATA" create debian-python --name dev --memory 4g --cpus 2 --pids 1024 --flush /tmp/wheels --flush /home/user/.cache)
"$STRATA" cp "$WHEELHOUSE" "$DEV:/tmp/wheels"
"$STRATA" exec -u user "$DEV" -- sh -c '
  python3 -m venv ~/venv &&
  ~/venv/bin/pip install --quiet --disable-pip-version-check --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt &&
  echo "installed $(~/venv/bin/pip list --disable-pip-version-check 2>/dev/null | tail -n +3 | wc -l) packages into ~/venv"'
"$STRATA" exec -u user "$DEV" -- sh -c '
  git config --global user.email agent@example.com && git config --global user.name agent &&
  mkdir -p ~/proj && cd ~/proj && git init -q . &&
  cat > calc.py <<PY
def add(a, b):
    return a - b
PY
  cat > test_calc.py <<PY
from calc import add
assert add(2, 3) == 5, "add(2, 3) should be 5"
print("tests pass")
PY
  git add -A && git commit -qm setup && echo "setup done: $(~/venv/bin/python -V)"'
SETUP_MS=$(( $(ms) - t ))
row setup "persistent" "$SETUP_MS" "$NPKG packages, repo, code (private writable layer)"

echo
note "stage 1b · template: the prepared environment is scanned (state hygiene) and becomes a warm starting point"
"$STRATA" scan "$DEV" | tail -2 || true
t=$(ms)
"$STRATA" template create proj-env --from "$DEV" >/dev/null
row template "checkpoint -> template" "$(( $(ms) - t ))" "setup sealed as layers after a clean scan; wheels flushed"

echo
note "stage 2 · execute: several steps in the same sandbox, with a checkpoint"
t=$(ms)
"$STRATA" exec -u user "$DEV" -- sh -c 'cd ~/proj && ~/venv/bin/python -B test_calc.py' || echo "(the test fails: the bug is still there)"
BUG=$("$STRATA" checkpoint "$DEV" --name before-fix)
row execute "persistent + checkpoint" "$(( $(ms) - t ))" "checkpoint before-fix"

echo
note "stage 3 · fan-out: fork 4 from the checkpoint, try a different fix in each, keep the passing one"
t=$(ms)
# One copy-on-write child per fix, run concurrently; the first whose test passes wins and
# is promoted to the checkpoint `fixed`; the other children are destroyed.
"$STRATA" fork before-fix --name-prefix attempt \
    --run "cd /home/user/proj && sed -i 's/return a - b/return {arg}/' calc.py && chown user:user calc.py && /home/user/venv/bin/python -B test_calc.py" \
    --arg "a * b" --arg "b - a" --arg "a + b" --arg "a // b" --select first --promote fixed --json >"$WORK/fanout.json"
python3 - "$WORK/fanout.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for a in r["attempts"]:
    fix = ["a * b", "b - a", "a + b", "a // b"][a["index"] - 1]
    print("  attempt-%d (%s): %s, exit %s, %d ms" % (a["index"], fix, a["outcome"], a.get("exit_code"), a["duration_ms"]))
print("  winner: attempt-%s, promoted as checkpoint fixed" % r.get("winner"))
PY
WINNER=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["winner_sandbox"])' "$WORK/fanout.json")
"$STRATA" restore "$DEV" --to fixed >/dev/null
"$STRATA" exec -u user "$DEV" -- sh -c 'cd ~/proj && git commit -qam fix && ~/venv/bin/python -B test_calc.py'
"$STRATA" rm -f "$WINNER" >/dev/null
"$STRATA" lineage "$DEV"
row fan-out "fork 4, select" "$(( $(ms) - t ))" "winner promoted (checkpoint fixed), adopted by dev; losers destroyed"

echo
note "the lifecycle advisor on the next stage (a dev server, long idle gaps between agent turns):"
"$STRATA" advise --keep processes,generated-files --setup "${SETUP_MS}ms" --turns 5 --turn 1m --idle 30m | sed -n '1,4p'

echo
note "stage 4 · idle: the dev server keeps running into standby (processes and memory on disk, CPU and RAM released)"
"$STRATA" exec -d -u user "$DEV" -- sh -c 'cd ~/proj && exec ~/venv/bin/python -m http.server 8000 --bind 127.0.0.1' >/dev/null
for _ in $(seq 50); do
    "$STRATA" exec -u user "$DEV" -- curl -sf -o /dev/null http://127.0.0.1:8000/ 2>/dev/null && break
    sleep 0.1
done
"$STRATA" proc ls "$DEV" | grep http.server
t=$(ms)
"$STRATA" standby "$DEV"
IDLE_MS=$(( $(ms) - t ))
"$STRATA" inspect "$DEV" --json | python3 -c 'import json, sys; s = json.load(sys.stdin); b = s["standby"]; print("  %s: %s, image %d KiB, dump %d ms" % (s["state"], b["mode"], b["image_bytes"] // 1024, b["dump_ms"]))'
"$STRATA" ps
row idle "standby" "$IDLE_MS" "dev server's process tree + memory on disk; no CPU, no RAM"

echo
note "stage 5 · follow-up: the next call resumes the sandbox with its dev server still running; nothing is reinstalled"
t=$(ms)
"$STRATA" exec -u user "$DEV" -- sh -c 'curl -s http://127.0.0.1:8000/ | grep -o "calc.py" | head -1 && cd ~/proj && ~/venv/bin/python -B test_calc.py && git log --oneline | wc -l'
FOLLOW_MS=$(( $(ms) - t ))
"$STRATA" proc ls "$DEV" | grep http.server
"$STRATA" events "$DEV" | tail -2
row follow-up "resumed on access" "$FOLLOW_MS" "same processes (dev server up), venv and repo; setup not repaid"
t=$(ms)
NEXT=$("$STRATA" create proj-env --name next-task)
"$STRATA" exec -u user "$NEXT" -- sh -c 'cd ~/proj && ~/venv/bin/python -V'
TEMPLATE_MS=$(( $(ms) - t ))
"$STRATA" exec -u user "$NEXT" -- sh -c 'cd ~/proj && ~/venv/bin/python -c "import django, pandas, boto3, pytest; print(\"new task from the template: django\", django.__version__, \"pandas\", pandas.__version__, \"boto3\", boto3.__version__, \"import fine\")"'
"$STRATA" rm -f "$NEXT" >/dev/null
row new-task "from template" "$TEMPLATE_MS" "a new sandbox with the prepared venv, nothing reinstalled"

echo
note "stage 5a · warm fork: dev is checkpointed with its running dev server; 3 forks come up with it already serving"
t=$(ms)
"$STRATA" checkpoint "$DEV" --processes --name dev-warm --json |
    python3 -c 'import json, sys; c = json.load(sys.stdin); p = c["processes"]; print("  checkpoint %s: filesystem + %d API processes, %d KiB of process image, copied in %d ms" % (c["name"], p["api_processes"], p["bytes"] // 1024, p["dump_ms"]))'
"$STRATA" fork dev-warm --count 3 --name-prefix warm --json >"$WORK/warm.json"
for id in $(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["sandboxes"]))' "$WORK/warm.json"); do
    "$STRATA" exec -u user "$id" -- sh -c 'printf "  %s: dev server answers %s without being started\n" "$(hostname)" "$(curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8000/)"'
done
WARM_MS=$(( $(ms) - t ))
for id in $(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["sandboxes"]))' "$WORK/warm.json"); do
    "$STRATA" rm -f "$id" >/dev/null
done
row warm-fork "fork 3 with processes" "$WARM_MS" "each child: the running dev server (its memory), own identity"

echo
note "stage 5b · the next task as a pipeline (examples/demo/pipeline.toml): from the template, a lifecycle per stage"
t=$(ms)
"$STRATA" pipeline run examples/demo/pipeline.toml
PIPE_MS=$(( $(ms) - t ))
row pipeline "per stage (spec)" "$PIPE_MS" "work: checkpoint per step; fix: fork 4, winner kept; eval: nothing"

echo
note "stage 6 · evaluate: ephemeral, clean start, nothing left behind, on the gVisor tier (untrusted code: a user-space kernel between it and the host)"
"$STRATA" cp "$DEV:/home/user/proj" "$WORK/export"
BEFORE=$("$STRATA" ps --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
t=$(ms)
"$STRATA" run --rm --isolation gvisor debian-python --memory 1g -- python3 -c 'import os; print("eval in a fresh gVisor sandbox (kernel", os.uname().release + "); home has:", sorted(os.listdir("/home/user")))'
EVAL_MS=$(( $(ms) - t ))
LEFT=$("$STRATA" ps --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$LEFT" = "$BEFORE" ] || die "the ephemeral run left a sandbox behind ($BEFORE before, $LEFT after)"
row evaluate "ephemeral, gvisor" "$EVAL_MS" "nothing: sandboxes before and after = $LEFT (dev, the pipeline's kept outputs)"
if [ "${STRATA_DEMO_MICROVM:-0}" = 1 ]; then
    echo
    note "stage 6b · evaluate again on the microvm tier (STRATA_DEMO_MICROVM=1): a guest kernel of its own (TCG here: slow, see docs/microvm.md)"
    t=$(ms)
    "$STRATA" run --rm --isolation microvm debian-python --memory 1g -- python3 -c 'import os; print("eval in a fresh microVM (guest kernel", os.uname().release + ")")'
    EVAL_VM_MS=$(( $(ms) - t ))
    LEFT=$("$STRATA" ps --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
    [ "$LEFT" = "$BEFORE" ] || die "the ephemeral microVM left a sandbox behind ($BEFORE before, $LEFT after)"
    row evaluate "ephemeral, microvm" "$EVAL_VM_MS" "nothing: sandboxes before and after = $LEFT"
fi

echo
note "stage 7 · state over time: dev is checked on a schedule, then moved onto a patched base image without redoing setup"
# A check interval on the policy: the daemon's check loop scans dev's writable layer and measures
# what it has accumulated (without resuming it if it sleeps) once it falls due; here at once, since
# dev is older than the interval. Findings would be recorded (on_findings: record).
"$STRATA" update "$DEV" --check-every 1m --on-findings record >/dev/null
CHECKED=""
for _ in $(seq 90); do
    CHECKED=$("$STRATA" events "$DEV" --json | python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    if e["reason"] == "checked" and e.get("detail", "").startswith("scheduled"):
        print(e["detail"])' | tail -1)
    [ -n "$CHECKED" ] && break
    sleep 1
done
[ -n "$CHECKED" ] || die "no scheduled check of dev within 90 s"
echo "  scheduled check of dev: $CHECKED"
"$STRATA" update "$DEV" --check-every 6h >/dev/null
"$STRATA" inspect "$DEV" | grep -E '^(writable|image|checks) ' || true
# A patched base: the same Debian image with a security update (here: a marker file), imported as
# version 2 of the name. Version 1 stays for what was made from it; `strata outdated` lists that.
cp -a "$IMAGES/debian-python" "$WORK/debian-python-patched"
echo "demo security update $(date -u +%F)" >"$WORK/debian-python-patched/etc/strata-patch-level"
"$STRATA" image import "$WORK/debian-python-patched" --name debian-python --trusted --replace | tail -1
"$STRATA" outdated
# The template's setup is kept and moved: a sandbox from the template is rebased onto the new
# version (its writable layer, ~1 GB of venv, stays; conflicts would be listed) and promoted back.
t=$(ms)
"$STRATA" create proj-env --name patched-env >/dev/null
"$STRATA" stop patched-env >/dev/null
"$STRATA" rebase patched-env --onto debian-python
"$STRATA" start patched-env >/dev/null
"$STRATA" exec -u user patched-env -- sh -c 'cat /etc/strata-patch-level && cd ~/proj && ~/venv/bin/python -c "import django, pandas; print(\"the venv runs on the patched base: django\", django.__version__, \"pandas\", pandas.__version__)"'
"$STRATA" template create proj-env --from patched-env --replace >/dev/null
REBASE_MS=$(( $(ms) - t ))
"$STRATA" rm -f patched-env >/dev/null
"$STRATA" outdated | grep -q 'proj-env' && die "proj-env is still listed as outdated"
echo "  template proj-env is on debian-python version 2; reinstalling its setup took ${SETUP_MS} ms, the rebase ${REBASE_MS} ms"
row patch "rebase + promote" "$REBASE_MS" "proj-env moved onto the patched base, its setup layer kept"

echo
"$STRATA" events "$DEV"
echo
note "the web console: http://$LISTEN/ui (log in with the token in $WORK/state/api-token; STRATA_DEMO_KEEP=1 leaves the daemon up)"
echo
printf '%-10s | %-24s | %11s | %10s | %s\n' stage lifecycle time "cost (USD)" "state kept"
printf '%s\n' "-----------+--------------------------+-------------+------------+-------------------------------------------"
printf '%s\n' "${ROWS[@]}"
echo
note "what each sandbox cost (compute while running, storage by the hour), against ephemeral-only and always-on:"
"$STRATA" cost
echo
note "follow-up started in ${FOLLOW_MS} ms and a new task from the template in ${TEMPLATE_MS} ms, instead of reinstalling $NPKG packages (${SETUP_MS} ms of setup): $(( SETUP_MS / (TEMPLATE_MS > 0 ? TEMPLATE_MS : 1) ))x faster from the template, $(( (SETUP_MS - TEMPLATE_MS) / 1000 )) s saved per task"
