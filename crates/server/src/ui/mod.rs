//! The web console at `/ui` on the TCP listener: one more front end on the
//! engine, reached through the native API itself.
//!
//! * **Login** (`/ui/login`): an operator or tenant API token, checked as a
//!   bearer token is ([`strata_engine::tenancy::bearer_caller`]), opens a
//!   session: a random id in an `HttpOnly`, `SameSite=Strict` cookie scoped to
//!   `/ui`; the token stays on the server. A session ends at logout, after
//!   [`SESSION_TTL`], or as soon as its token no longer authenticates
//!   (revoked): the page then goes back to the login.
//! * **Pages** are static HTML and script embedded in the binary (no CDN,
//!   nothing fetched at run time; plain JavaScript, no framework): the fleet
//!   (`/ui/fleet`), a sandbox (`/ui/sandboxes/{id}`: its events, processes and
//!   their output, a command line, a terminal, files), its lineage
//!   (`/ui/lineage/{id}`, a drawn graph with fork, promote, delete, restore),
//!   pipelines, the Rule-of-Two approval queue, cost and audit. A sandbox or
//!   checkpoint the session may not see is a 404 page, as on the API. The terminal is xterm.js, vendored at a pinned
//!   version (`assets/vendor/xterm/`, `scripts/vendor-console.sh`).
//! * **Data and actions** (`/ui/api/...`) are the native API (`/v1/...`)
//!   called with the session's token: the same validation, tenant scoping,
//!   audit, errors (a 409 carries the current state) and Rule of Two as for
//!   any client. A mutating call needs the session's CSRF token in the
//!   `X-Strata-CSRF` header (403 `forbidden` without it, nothing done), which
//!   only the console's own pages can read. A WebSocket (a terminal) cannot
//!   carry that header: its handshake must come from the console's own
//!   origin (`Origin` naming the host the request was sent to).
//!
//! Not on the Unix socket: a browser reaches TCP.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use strata_api::ErrorCode;
use strata_engine::state::Shared;

use crate::error::ApiError;

/// How long a console session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// The session cookie's name.
const COOKIE: &str = "strata_ui";
/// The header a mutating call carries the session's CSRF token in.
pub const CSRF_HEADER: &str = "x-strata-csrf";
/// The largest login form taken.
const MAX_FORM: usize = 8 << 10;

const LOGIN_HTML: &str = include_str!("assets/login.html");
const LAYOUT_HTML: &str = include_str!("assets/layout.html");
const APP_JS: &str = include_str!("assets/app.js");

/// A page of the console: its `<main>` and its script, in the common layout.
struct Page {
    /// Its path under `/ui/` and the name of its script and `<main>` (`assets/NAME.js`, `NAME.html`).
    name: &'static str,
    /// Shown in the title and the navigation.
    title: &'static str,
    main: &'static str,
    script: &'static str,
    /// Extra `<head>` lines (the terminal's library).
    head: &'static str,
    /// Listed in the navigation.
    nav: bool,
}

/// A [`Page`] whose `<main>` and script are `assets/NAME.html` and `assets/NAME.js`.
macro_rules! page {
    ($name:literal, $title:literal, nav: $nav:literal, head: $head:expr) => {
        Page {
            name: $name,
            title: $title,
            main: include_str!(concat!("assets/", $name, ".html")),
            script: include_str!(concat!("assets/", $name, ".js")),
            head: $head,
            nav: $nav,
        }
    };
}

const PAGES: &[Page] = &[
    page!("fleet", "Fleet", nav: true, head: ""),
    page!("pipelines", "Pipelines", nav: true, head: ""),
    page!("approvals", "Approvals", nav: true, head: ""),
    page!("cost", "Cost", nav: true, head: ""),
    page!("audit", "Audit", nav: true, head: ""),
    page!("lineage", "lineage of {{name}}", nav: false, head: "<meta name=\"focus\" content=\"{{id}}\">"),
    page!("sandbox", "{{name}}", nav: false, head: concat!(
        "<meta name=\"sandbox\" content=\"{{id}}\">\n",
        "<link rel=\"stylesheet\" href=\"/ui/assets/vendor/xterm.css\">\n",
        "<script src=\"/ui/assets/vendor/xterm.js\" defer></script>"
    )),
];

fn page_named(name: &str) -> Option<&'static Page> {
    PAGES.iter().find(|p| p.name == name)
}

/// A page in the layout, its placeholders still to fill (`{{csrf}}`, `{{who}}`, the page's own).
fn layout(page: &Page) -> String {
    let nav: String = PAGES
        .iter()
        .filter(|p| p.nav)
        .map(|p| {
            let current = if p.name == page.name { " class=\"current\"" } else { "" };
            format!("<a href=\"/ui/{}\"{current}>{}</a>", p.name, p.title)
        })
        .collect();
    LAYOUT_HTML
        .replace("{{main}}", page.main)
        .replace("{{head}}", page.head)
        .replace("{{nav}}", &nav)
        .replace("{{script}}", page.name)
        .replace("{{title}}", page.title)
}
const XTERM_JS: &str = include_str!("assets/vendor/xterm/xterm.js");
const XTERM_CSS: &str = include_str!("assets/vendor/xterm/xterm.css");
const APP_CSS: &str = include_str!("assets/app.css");

/// One logged-in browser.
#[derive(Clone)]
struct Session {
    /// The API token it acts with (never sent to the browser).
    token: String,
    /// What mutating calls must carry.
    csrf: String,
    /// Who it is, as shown on the pages.
    who: String,
    expires: Instant,
}

/// Open sessions by id (in memory: a daemon restart logs everyone out).
struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
    ttl: Duration,
}

impl Sessions {
    fn new(ttl: Duration) -> Sessions {
        Sessions { by_id: Mutex::default(), ttl }
    }

    /// Session `id`, if it has not expired (expired ones are forgotten).
    fn get(&self, id: &str) -> Option<Session> {
        let mut by_id = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        by_id.retain(|_, s| s.expires > now);
        by_id.get(id).cloned()
    }

    /// A new session acting with `token`: its id.
    fn open(&self, token: String, who: String) -> String {
        let session = Session { token, csrf: random_hex(), who, expires: Instant::now() + self.ttl };
        let id = random_hex();
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), session);
        id
    }

    fn close(&self, id: &str) {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

/// The console's state.
pub struct Console {
    st: Shared,
    operator_token: Arc<String>,
    sessions: Sessions,
    /// The listener's API (authenticated by bearer token), which the
    /// console's calls are routed through.
    api: axum::Router,
}

impl Console {
    /// The console of a daemon whose operator token is `operator_token`, calling `api`.
    pub fn new(st: Shared, operator_token: Arc<String>, api: axum::Router) -> Arc<Console> {
        Arc::new(Console { st, operator_token, sessions: Sessions::new(SESSION_TTL), api })
    }

    /// The session a request's cookie names, if it is still valid.
    fn session(&self, req: &Request) -> Option<(String, Session)> {
        let id = cookie(req, COOKIE)?;
        self.sessions.get(&id).map(|s| (id, s))
    }

    fn open(&self, token: String, who: String) -> String {
        self.sessions.open(token, who)
    }

    fn close(&self, id: &str) {
        self.sessions.close(id)
    }

    /// Who `token` authenticates as (`None`: nobody, e.g. revoked).
    fn who(&self, token: &str) -> Option<String> {
        strata_engine::tenancy::bearer_caller(&self.st, &self.operator_token, token).ok().map(|c| c.actor())
    }
}

fn random_hex() -> String {
    let b: [u8; 24] = rand::random();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The value of cookie `name` in a request.
fn cookie(req: &Request, name: &str) -> Option<String> {
    req.headers().get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.split(';').find_map(|kv| {
            let (k, val) = kv.trim().split_once('=')?;
            (k == name).then(|| val.to_string())
        })
    })
}

fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Nothing but the console's own scripts; its own style sheets and the
    // style attributes the terminal sets on its rows; connections (the
    // terminal's WebSocket) to itself only; no framing by another site.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    r
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Escapes text for HTML.
fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&#39;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn login_page(status: StatusCode, message: &str) -> Response {
    html(status, LOGIN_HTML.replace("{{message}}", &escape(message)))
}

/// Middleware: serves `/ui` (before the API's authentication, which the
/// console's own calls then go through with the session's token).
pub async fn intercept(State(console): State<Arc<Console>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if path != "/ui" && !path.starts_with("/ui/") {
        return next.run(req).await;
    }
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::GET, "/ui" | "/ui/") => redirect("/ui/fleet"),
        (Method::GET, "/ui/assets/app.js") => asset("text/javascript; charset=utf-8", APP_JS),
        (Method::GET, "/ui/assets/vendor/xterm.js") => asset("text/javascript; charset=utf-8", XTERM_JS),
        (Method::GET, "/ui/assets/vendor/xterm.css") => asset("text/css; charset=utf-8", XTERM_CSS),
        (Method::GET, "/ui/assets/app.css") => asset("text/css; charset=utf-8", APP_CSS),
        (Method::GET, "/ui/login") => {
            let expired = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "expired=1"));
            login_page(StatusCode::OK, if expired { "Your session ended: log in again." } else { "" })
        }
        (Method::POST, "/ui/login") => login(&console, req).await,
        (Method::POST, "/ui/logout") => {
            if let Some((id, s)) = console.session(&req) {
                // A logout is a change too: only the console's own page can ask for it.
                if csrf_ok(&req, &s) {
                    console.close(&id);
                }
            }
            let mut r = redirect("/ui/login");
            r.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_static("strata_ui=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict"),
            );
            r
        }
        (Method::GET, p) if p.starts_with("/ui/assets/") && p.ends_with(".js") => {
            let name = p.trim_start_matches("/ui/assets/").trim_end_matches(".js");
            match page_named(name) {
                Some(page) => asset("text/javascript; charset=utf-8", page.script),
                None => not_found(),
            }
        }
        (Method::GET, p) if p.starts_with("/ui/sandboxes/") || p.starts_with("/ui/lineage/") => {
            let (name, key) = match p.strip_prefix("/ui/sandboxes/") {
                Some(key) => ("sandbox", key.to_string()),
                None => ("lineage", p.trim_start_matches("/ui/lineage/").to_string()),
            };
            // An id, id prefix or name: nothing that could reach another route.
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
                return not_found_page(&key);
            }
            let lookup = if name == "sandbox" { format!("sandboxes/{key}") } else { format!("lineage/{key}") };
            object_page(&console, req, name, &lookup, &key).await
        }
        (_, p) if p.starts_with("/ui/api/") => api(&console, req).await,
        (Method::GET, p) if page_named(p.trim_start_matches("/ui/")).is_some_and(|pg| pg.nav) => {
            let pg = page_named(p.trim_start_matches("/ui/")).expect("matched above");
            page(&console, &req, pg, &[])
        }
        _ => not_found(),
    }
}

/// A page for the request's session (the login when it has none), with
/// `{{csrf}}`, `{{who}}` and `vars` filled in (escaped).
fn page(console: &Console, req: &Request, page: &Page, vars: &[(&str, &str)]) -> Response {
    match console.session(req) {
        Some((_, s)) if console.who(&s.token).is_some() => {
            let mut body = layout(page).replace("{{csrf}}", &escape(&s.csrf)).replace("{{who}}", &escape(&s.who));
            for (k, v) in vars {
                body = body.replace(&format!("{{{{{k}}}}}"), &escape(v));
            }
            html(StatusCode::OK, body)
        }
        _ => redirect("/ui/login?expired=1"),
    }
}

/// `/ui/sandboxes/{key}` and `/ui/lineage/{key}`: the page of what the key
/// names for the session's caller, looked up first through the API (so it
/// shows exactly what the API would: `lookup` is the API path of the
/// object), or a 404 page. The page gets the object's `id` and `name`.
async fn object_page(console: &Console, req: Request, name: &str, lookup: &str, key: &str) -> Response {
    let Some((id, s)) = console.session(&req) else { return redirect("/ui/login?expired=1") };
    let get = Request::builder()
        .method(Method::GET)
        .uri(format!("/ui/api/{lookup}"))
        .body(axum::body::Body::empty())
        .expect("a GET request");
    let r = call_api(console, &id, &s, get).await;
    match r.status() {
        StatusCode::OK => {
            let found = axum::body::to_bytes(r.into_body(), 16 << 20)
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            let Some(found) = found else {
                return html(
                    StatusCode::BAD_GATEWAY,
                    "<!doctype html><title>Error</title><p>It could not be read.".into(),
                );
            };
            // A sandbox's id and name, or the focus of a lineage.
            let field = |k: &str| found[k].as_str().map(str::to_string);
            let oid = field("id").or_else(|| field("focus")).unwrap_or_else(|| key.to_string());
            let oname = field("name").unwrap_or_else(|| key.to_string());
            let page_of = page_named(name).expect("a page of the console");
            page(console, &req, page_of, &[("id", &oid), ("name", &oname)])
        }
        StatusCode::UNAUTHORIZED => redirect("/ui/login?expired=1"),
        _ => not_found_page(key),
    }
}

fn not_found() -> Response {
    html(StatusCode::NOT_FOUND, "<!doctype html><title>Not found</title><p>No such console page.".into())
}

/// The page of an object the session cannot see (unknown, or another tenant's: the same answer).
fn not_found_page(key: &str) -> Response {
    html(
        StatusCode::NOT_FOUND,
        format!(
            "<!doctype html><title>Not found</title><link rel=\"stylesheet\" href=\"/ui/assets/app.css\">\
             <main><h2 id=\"not-found\">No sandbox or checkpoint {} here</h2><p><a href=\"/ui/fleet\">Back to the fleet</a></main>",
            escape(key)
        ),
    )
}

fn is_websocket(req: &Request) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Whether the request's `Origin` is the host it was sent to (`http://HOST`).
fn same_origin(req: &Request) -> bool {
    let header = |name| req.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    match (header(header::ORIGIN), header(header::HOST)) {
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host)
        }
        _ => false,
    }
}

fn csrf_ok(req: &Request, s: &Session) -> bool {
    let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    strata_engine::tenancy::constant_time_eq(given.as_bytes(), s.csrf.as_bytes())
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(console: &Console, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
        return login_page(StatusCode::BAD_REQUEST, "The form is too large.");
    };
    let req = Request::from_parts(parts, axum::body::Body::from(bytes));
    let Ok(axum::Form(form)) = <axum::Form<LoginForm> as axum::extract::FromRequest<()>>::from_request(req, &()).await
    else {
        return login_page(StatusCode::BAD_REQUEST, "Enter an API token.");
    };
    let token = form.token.trim().to_string();
    let Some(who) = console.who(&token) else {
        return login_page(StatusCode::UNAUTHORIZED, "That token is not valid (unknown, revoked or expired).");
    };
    let id = console.open(token, who);
    let mut r = redirect("/ui/fleet");
    let cookie =
        format!("{COOKIE}={id}; Path=/ui; Max-Age={}; HttpOnly; SameSite=Strict", console.sessions.ttl.as_secs());
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `/ui/api/REST` -> the native API's `/v1/REST`, as the session's token.
async fn api(console: &Console, req: Request) -> Response {
    let Some((id, s)) = console.session(&req) else {
        return ApiError::new(ErrorCode::Unauthorized, "no console session (log in at /ui/login)").into_response();
    };
    if is_websocket(&req) && !same_origin(&req) {
        return ApiError::new(
            ErrorCode::Forbidden,
            "a console WebSocket must be opened by the console's own page (Origin); nothing was done",
        )
        .into_response();
    }
    let reads = matches!(*req.method(), Method::GET | Method::HEAD);
    if !reads && !csrf_ok(&req, &s) {
        return ApiError::new(
            ErrorCode::Forbidden,
            "a change from the console needs its CSRF token (X-Strata-CSRF); nothing was done",
        )
        .into_response();
    }
    call_api(console, &id, &s, req).await
}

/// Routes a `/ui/api/REST` request to `/v1/REST` with the session's token.
async fn call_api(console: &Console, id: &str, s: &Session, mut req: Request) -> Response {
    let rest = req.uri().path().trim_start_matches("/ui/api/").to_string();
    let target = match req.uri().query() {
        Some(q) => format!("/v1/{rest}?{q}"),
        None => format!("/v1/{rest}"),
    };
    let Ok(uri) = target.parse::<Uri>() else {
        return ApiError::bad_request(format!("invalid path {target:?}")).into_response();
    };
    *req.uri_mut() = uri;
    let h = req.headers_mut();
    h.remove(header::COOKIE);
    h.remove(CSRF_HEADER);
    match HeaderValue::from_str(&format!("Bearer {}", s.token)) {
        Ok(v) => h.insert(header::AUTHORIZATION, v),
        Err(_) => return ApiError::new(ErrorCode::Unauthorized, "the session's token is malformed").into_response(),
    };
    // Routed anew (a middleware's `next` is the route already chosen for
    // `/ui/...`); the API's authentication checks the token, and a token that
    // no longer authenticates (revoked) ends the session.
    let r = match tower::ServiceExt::oneshot(console.api.clone(), req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    if r.status() == StatusCode::UNAUTHORIZED {
        console.close(id);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            escape("<script>\"x\" & 'y'</script>"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn sessions_expire_and_close() {
        let live = Sessions::new(Duration::from_secs(3600));
        let id = live.open("tok".into(), "operator".into());
        let s = live.get(&id).expect("open");
        assert_eq!((s.token.as_str(), s.csrf.len()), ("tok", 48));
        assert!(live.get("another").is_none());
        live.close(&id);
        assert!(live.get(&id).is_none(), "closed at logout");
        let short = Sessions::new(Duration::ZERO);
        let id = short.open("tok".into(), "operator".into());
        assert!(short.get(&id).is_none(), "expired");
    }

    #[test]
    fn a_websocket_must_come_from_the_console_s_own_origin() {
        let ws = |origin: Option<&str>| {
            let mut b = Request::builder().header(header::HOST, "127.0.0.1:8080").header(header::UPGRADE, "websocket");
            if let Some(o) = origin {
                b = b.header(header::ORIGIN, o);
            }
            b.body(axum::body::Body::empty()).unwrap()
        };
        assert!(is_websocket(&ws(None)));
        assert!(same_origin(&ws(Some("http://127.0.0.1:8080"))));
        assert!(!same_origin(&ws(Some("http://evil.example"))), "another site");
        assert!(!same_origin(&ws(Some("http://127.0.0.1:8080.evil.example"))), "a longer host");
        assert!(!same_origin(&ws(Some("null"))), "an opaque origin");
        assert!(!same_origin(&ws(None)), "no origin");
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let req = Request::builder()
            .header(header::COOKIE, "a=1; strata_ui=abc123; b=2")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(cookie(&req, COOKIE).as_deref(), Some("abc123"));
        let none = Request::builder().header(header::COOKIE, "strata_uix=1").body(axum::body::Body::empty()).unwrap();
        assert_eq!(cookie(&none, COOKIE), None);
    }
}
