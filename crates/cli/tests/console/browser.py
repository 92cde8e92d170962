"""The web console in a real browser (headless Chromium, driven by Selenium).

Run by crates/cli/tests/console.rs, which starts the daemon and passes, in the
environment: STRATA_URL, OPERATOR_TOKEN, TENANT_TOKEN, TENANT_TOKEN_ID,
SANDBOX (the operator's), TENANT_SANDBOX, SHOTS (a directory for screenshots).
Exits non-zero, saying what failed, when the console does not do its part.
"""

import json
import os
import sys
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


def api(method, path, token=OPERATOR):
    """The native API, as a client other than the console."""
    req = urllib.request.Request(URL + path, method=method, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
        return json.loads(body) if body else None


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

    step("a revoked token ends the session: back to the login")
    api("DELETE", f"/v1/tokens/{TENANT_TOKEN_ID}")
    wait.until(EC.url_contains("/ui/login"), "the console went back to the login after the revocation")
    wait.until(EC.text_to_be_present_in_element((By.ID, "message"), "session ended"))
    step("done")
except Exception as e:  # noqa: BLE001 - every failure is reported with the page it happened on
    drv.save_screenshot(os.path.join(SHOTS, "failure.png"))
    print(f"console test failed: {e!r}\nat {drv.current_url}\n{drv.page_source[:3000]}", file=sys.stderr)
    sys.exit(1)
finally:
    drv.quit()
