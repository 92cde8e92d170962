"""The web console in a real browser (headless Chromium, driven by Selenium).

Run by crates/cli/tests/console.rs, which starts the daemon and passes, in the
environment: STRATA_URL, OPERATOR_TOKEN, TENANT_TOKEN, TENANT_TOKEN_ID,
SANDBOX (the operator's), TENANT_SANDBOX, SHOTS (a directory for screenshots).
Exits non-zero, saying what failed, when the console does not do its part.
"""

import json
import os
import sys
import traceback
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["STRATA_URL"]
OPERATOR = os.environ["OPERATOR_TOKEN"]
TENANT = os.environ["TENANT_TOKEN"]
TENANT_TOKEN_ID = os.environ["TENANT_TOKEN_ID"]
SANDBOX = os.environ["SANDBOX"]
TENANT_SANDBOX = os.environ["TENANT_SANDBOX"]
SHOTS = os.environ["SHOTS"]


def api(method, path, token=OPERATOR, body=None, headers=None):
    """The native API, as a client other than the console."""
    h = {"Authorization": "Bearer " + token, **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(URL + path, method=method, headers=h, data=data)
    with urllib.request.urlopen(req, timeout=60) as r:
        out = r.read()
        return json.loads(out) if out else None


def api_error(method, path, token, body=None):
    """The status and error body of a request the API refuses."""
    try:
        api(method, path, token, body)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    raise AssertionError(f"{method} {path} was not refused")


def step(what):
    print("console:", what, flush=True)


opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,800"):
    opts.add_argument(a)
drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
# The fleet table is redrawn when what it shows changes: an element found just
# before a redraw is stale, and is looked up again.
wait = WebDriverWait(drv, 30, ignored_exceptions=[StaleElementReferenceException])


def state_of(sid):
    for _ in range(10):
        try:
            cells = drv.find_elements(By.CSS_SELECTOR, f'tr[data-id="{sid}"] .state')
            return cells[0].text if cells else None
        except StaleElementReferenceException:
            continue
    return None


def click_action(sid, action):
    def clicked(d):
        try:
            d.find_element(By.CSS_SELECTOR, f'tr[data-id="{sid}"] button[data-action="{action}"]').click()
            return True
        except StaleElementReferenceException:
            return False

    wait.until(clicked, f"the {action} button of {sid}")


def wait_state(sid, state):
    wait.until(lambda d: state_of(sid) == state, f"sandbox {sid} shown {state} (shown: {state_of(sid)})")


def log_in(token):
    drv.get(URL + "/ui/login")
    field = wait.until(EC.presence_of_element_located((By.ID, "token")))
    field.clear()
    field.send_keys(token)
    drv.find_element(By.ID, "login").click()


def fetch_status(method, path, with_csrf):
    """A request made from the console's page itself; its HTTP status."""
    return drv.execute_async_script(
        """
        const [method, path, withCsrf, done] = arguments;
        const headers = withCsrf ? {"X-Strata-CSRF": document.querySelector('meta[name="csrf"]').content} : {};
        fetch(path, {method, headers, credentials: "same-origin"}).then(r => done(r.status), e => done(String(e)));
        """,
        method,
        path,
        with_csrf,
    )


try:
    step("the fleet without a session goes to the login; a wrong token is refused")
    drv.get(URL + "/ui/fleet")
    wait.until(EC.url_contains("/ui/login"))
    log_in("stk_not_a_token")
    wait.until(EC.text_to_be_present_in_element((By.ID, "message"), "not valid"))
    drv.save_screenshot(os.path.join(SHOTS, "login.png"))

    step("the operator logs in and sees the sandbox running")
    log_in(OPERATOR)
    wait.until(EC.url_contains("/ui/fleet"))
    wait_state(SANDBOX, "running")
    assert state_of(TENANT_SANDBOX) == "running", "the operator sees every tenant's sandboxes"
    drv.save_screenshot(os.path.join(SHOTS, "fleet.png"))

    step("live CPU, memory and disk of the sandbox (its cgroup's figures, sampled)")
    wait.until(
        lambda d: "/" in d.find_element(By.CSS_SELECTOR, f'tr[data-id="{SANDBOX}"] td.mem').text,
        "the sandbox's memory shown",
    )
    mem = drv.find_element(By.CSS_SELECTOR, f'tr[data-id="{SANDBOX}"] td.mem').text
    assert mem.endswith("/ 2.0 GiB"), f"memory against its 2 GiB limit: {mem}"
    assert drv.find_element(By.CSS_SELECTOR, f'tr[data-id="{SANDBOX}"] td.cpu').text.endswith("%")
    drv.save_screenshot(os.path.join(SHOTS, "fleet.png"))

    step("a change made through the API shows up live")
    api("POST", f"/v1/sandboxes/{SANDBOX}/stop")
    wait_state(SANDBOX, "stopped")

    step("an action from the console: start")
    click_action(SANDBOX, "start")
    wait_state(SANDBOX, "running")
    assert api("GET", f"/v1/sandboxes/{SANDBOX}")["state"] == "running"

    step("an illegal transition shows the API's 409 with the current state")
    drv.execute_script("act({id: arguments[0]}, 'resume').catch(showError)", SANDBOX)
    wait.until(EC.text_to_be_present_in_element((By.ID, "error"), "it is running"))
    shown = drv.find_element(By.ID, "error").text
    assert "409" in shown and "invalid_state" in shown, shown

    step("a forged change without the CSRF token: 403, nothing done")
    status = fetch_status("POST", f"/ui/api/sandboxes/{SANDBOX}/stop", False)
    assert status == 403, f"a change without the CSRF token answered {status}"
    assert api("GET", f"/v1/sandboxes/{SANDBOX}")["state"] == "running", "the forged stop took effect"
    assert fetch_status("GET", "/ui/api/sandboxes", False) == 200, "reads need no CSRF token"

    step("the sandbox page: its facts, events, a command and its output, processes, files")
    drv.get(URL + "/ui/fleet")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-id="{SANDBOX}"] a.sandbox-link'))
    drv.find_element(By.CSS_SELECTOR, f'tr[data-id="{SANDBOX}"] a.sandbox-link').click()
    wait.until(EC.url_contains(f"/ui/sandboxes/{SANDBOX}"))
    wait.until(EC.text_to_be_present_in_element((By.ID, "state"), "running"))
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#events li")) >= 3, "the events timeline")
    timeline = drv.find_element(By.ID, "events").text
    assert "stopped" in timeline and "running" in timeline, timeline
    command = drv.find_element(By.ID, "command")
    command.send_keys("echo hello-from-console; echo to-stderr >&2; exit 3")
    drv.find_element(By.ID, "run-button").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "output"), "[exit 3]"))
    out = drv.find_element(By.ID, "output").text
    assert "hello-from-console" in out and "to-stderr" in out, out
    wait.until(lambda d: "hello-from-console" in d.find_element(By.ID, "processes").text, "the process is listed")
    drv.find_element(By.CSS_SELECTOR, "#processes tbody tr button").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "logs"), "hello-from-console"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#files tr[data-name="bin"]'), "/ listed")
    path = drv.find_element(By.ID, "path")
    path.clear()
    path.send_keys("/tmp")
    path.submit()
    upload = os.path.abspath(os.path.join(SHOTS, "console-upload.txt"))
    with open(upload, "w") as f:
        f.write("uploaded through the console\n")
    drv.find_element(By.ID, "upload").send_keys(upload)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#files tr[data-name="console-upload.txt"]'), "the upload listed")
    got = urllib.request.urlopen(
        urllib.request.Request(
            URL + f"/v1/sandboxes/{SANDBOX}/files?path=/tmp/console-upload.txt",
            headers={"Authorization": "Bearer " + OPERATOR},
        ),
        timeout=60,
    ).read()
    assert got == b"uploaded through the console\n", got
    assert fetch_status("PUT", f"/ui/api/sandboxes/{SANDBOX}/files?path=/tmp/../../../etc/x", True) == 400, "path confinement"
    step("the terminal: a shell on a new terminal, typed into, its output shown")
    drv.find_element(By.ID, "terminal-open").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "terminal-state"), "attached"))
    keys = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#terminal .xterm-helper-textarea")))
    keys.send_keys("echo term-$((6*7))\n")
    wait.until(
        lambda d: "term-42" in d.find_element(By.CSS_SELECTOR, "#terminal .xterm-rows").text,
        "the shell's output in the terminal",
    )
    assert "term-$((6*7))" in drv.find_element(By.CSS_SELECTOR, "#terminal .xterm-rows").text, "the typed line is echoed"
    drv.set_window_size(1400, 1500)
    drv.save_screenshot(os.path.join(SHOTS, "sandbox.png"))
    keys.send_keys("exit\n")
    wait.until(EC.text_to_be_present_in_element((By.ID, "terminal-state"), "exited"))
    # The session's cookie in a WebSocket handshake from another site's page: refused.
    session = drv.get_cookie("strata_ui")["value"]
    handshake = {
        "Cookie": f"strata_ui={session}",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        "Origin": "http://evil.example",
    }
    try:
        urllib.request.urlopen(
            urllib.request.Request(URL + f"/ui/api/sandboxes/{SANDBOX}/processes/1/tty", headers=handshake), timeout=30
        )
        raise AssertionError("a cross-site terminal WebSocket was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    drv.set_window_size(1400, 800)

    step("lineage: a fork is a child of its checkpoint; a fork from the graph; a delete refused with its dependents")
    ck = api("POST", f"/v1/sandboxes/{SANDBOX}/checkpoints", body={"name": "console-ck"})
    child = api("POST", "/v1/fork", body={"source": ck["id"], "count": 1})["sandboxes"][0]
    drv.find_element(By.ID, "lineage-link").click()
    wait.until(EC.url_contains(f"/ui/lineage/{SANDBOX}"))
    wait.until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#graph g.node.sandbox[data-id="{child}"][data-parent="{ck["id"]}"]'),
        "the fork drawn as a child of its checkpoint",
    )
    # A checkpoint hangs from its parent checkpoint, or (the first) from its image.
    assert drv.find_elements(By.CSS_SELECTOR, f'#graph g.node.checkpoint[data-id="{ck["id"]}"][data-parent="busybox"]')
    drv.find_element(By.CSS_SELECTOR, f'#graph g.node[data-id="{ck["id"]}"]').click()
    count = wait.until(EC.presence_of_element_located((By.ID, "fork-count")))
    count.clear()
    count.send_keys("2")
    drv.find_element(By.CSS_SELECTOR, '#panel button[data-action="fork"]').click()
    wait.until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, f'#graph g.node.sandbox[data-parent="{ck["id"]}"]')) == 3,
        "two more forks drawn under the checkpoint",
    )
    drv.find_element(By.CSS_SELECTOR, '#panel button[data-action="delete"]').click()
    drv.switch_to.alert.accept()
    wait.until(EC.text_to_be_present_in_element((By.ID, "error"), "409"))
    shown = drv.find_element(By.ID, "error").text
    assert "in_use" in shown and child in shown, shown
    assert api("GET", f"/v1/checkpoints/{ck['id']}")["id"] == ck["id"], "the refused delete left the checkpoint"
    drv.save_screenshot(os.path.join(SHOTS, "lineage.png"))

    step("approvals: a request refused with approval_required goes through after an approve in the console")
    three = {
        "source": "busybox",
        "name": "three-caps",
        "capabilities": ["untrusted_input", "sensitive_access", "external_comms"],
    }
    status, refused = api_error("POST", "/v1/sandboxes", TENANT, three)
    assert status == 403 and refused["code"] == "approval_required", refused
    approval = refused["approval"]["id"]
    drv.get(URL + "/ui/approvals")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-id="{approval}"] button[data-action="approve"]'))
    row = drv.find_element(By.CSS_SELECTOR, f'tr[data-id="{approval}"]').text
    assert "create sandbox" in row and "untrusted_input" in row and "external_comms" in row, row
    drv.save_screenshot(os.path.join(SHOTS, "approvals.png"))
    drv.find_element(By.CSS_SELECTOR, f'tr[data-id="{approval}"] button[data-action="approve"]').click()
    alert = wait.until(EC.alert_is_present())
    alert.send_keys("checked by the console test")
    alert.accept()
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, f'tr[data-id="{approval}"]'), "the approval left the pending list")
    decided = api("GET", f"/v1/approvals/{approval}")
    assert decided["state"] == "approved" and decided["reason"] == "checked by the console test", decided
    created = api("POST", "/v1/sandboxes", TENANT, three, {"X-Strata-Approval": approval})
    assert created["id"], created

    step("pipelines: a run's stages on a time line, a fan-out's winner")
    pipeline = """
name = "console-demo"

[[stage]]
name = "setup"
source = "image:busybox"
lifecycle = "persistent"
commands = ["mkdir -p /work && echo ready > /work/setup"]

[[stage]]
name = "fix"
source = "stage:setup"
lifecycle = "fork"
[stage.fanout]
run = "test {i} = 2"
count = 3

[[stage]]
name = "eval"
source = "stage:fix"
lifecycle = "ephemeral"
commands = ["grep -qx ready /work/setup"]
"""
    run = api("POST", "/v1/pipelines", body={"toml": pipeline})
    drv.get(URL + "/ui/pipelines")
    wait.until(
        lambda d: "succeeded"
        in d.find_element(By.CSS_SELECTOR, f'section.run[data-id="{run["id"]}"] h3 .state').text,
        "the run shown succeeded (live)",
    )
    card = drv.find_element(By.CSS_SELECTOR, f'section.run[data-id="{run["id"]}"]').text
    assert "setup" in card and "fix" in card and "eval" in card, card
    assert "fan-out of 3" in card and "★ #2" in card, card
    assert len(drv.find_elements(By.CSS_SELECTOR, f'section.run[data-id="{run["id"]}"] .timeline-bar .bar')) == 3
    drv.save_screenshot(os.path.join(SHOTS, "pipelines.png"))

    step("cost: every sandbox against the counterfactuals")
    drv.get(URL + "/ui/cost")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#cost tr[data-id="{SANDBOX}"]'), "the sandbox's cost")
    assert len(drv.find_elements(By.CSS_SELECTOR, "#chart .chart-row")) == 3
    assert "ephemeral only" in drv.find_element(By.ID, "totals").text
    drv.save_screenshot(os.path.join(SHOTS, "cost.png"))

    step("audit: the log and its verified chain")
    drv.get(URL + "/ui/audit")
    wait.until(EC.text_to_be_present_in_element((By.ID, "verify"), "chain verified"))
    assert "/v1/sandboxes/{id}/start" in drv.find_element(By.ID, "audit").text, "the console's start is in the log"
    assert "/v1/approvals/{id}/approve" in drv.find_element(By.ID, "audit").text, "the approval is in the log"
    drv.save_screenshot(os.path.join(SHOTS, "audit.png"))

    step("log out: the session is gone")
    drv.find_element(By.ID, "logout").click()
    wait.until(EC.url_contains("/ui/login"))
    drv.get(URL + "/ui/fleet")
    wait.until(EC.url_contains("/ui/login"))

    step("a tenant sees only its own sandboxes; another's id is a 404 through the console")
    log_in(TENANT)
    wait.until(EC.url_contains("/ui/fleet"))
    wait_state(TENANT_SANDBOX, "running")
    assert state_of(SANDBOX) is None, "a tenant's console shows another tenant's sandbox"
    assert fetch_status("GET", f"/ui/api/sandboxes/{SANDBOX}", False) == 404
    assert fetch_status("POST", f"/ui/api/sandboxes/{SANDBOX}/stop", True) == 404
    assert api("GET", f"/v1/sandboxes/{SANDBOX}")["state"] == "running"
    drv.get(URL + f"/ui/sandboxes/{SANDBOX}")
    wait.until(EC.presence_of_element_located((By.ID, "not-found")))
    assert fetch_status("GET", f"/ui/sandboxes/{SANDBOX}", False) == 404, "another tenant's sandbox page is a 404"
    drv.get(URL + f"/ui/sandboxes/{TENANT_SANDBOX}")
    wait.until(EC.text_to_be_present_in_element((By.ID, "state"), "running"))

    step("a revoked token ends the session: back to the login")
    api("DELETE", f"/v1/tokens/{TENANT_TOKEN_ID}")
    wait.until(EC.url_contains("/ui/login"), "the console went back to the login after the revocation")
    wait.until(EC.text_to_be_present_in_element((By.ID, "message"), "session ended"))
    step("done")
except Exception as e:  # noqa: BLE001 - every failure is reported with the page it happened on
    drv.save_screenshot(os.path.join(SHOTS, "failure.png"))
    print(f"console test failed: {e!r}\n{traceback.format_exc()}\nat {drv.current_url}\n{drv.page_source[:3000]}", file=sys.stderr)
    sys.exit(1)
finally:
    drv.quit()
