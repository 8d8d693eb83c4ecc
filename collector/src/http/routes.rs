//! One request in, one response out: the paths, who may see them, and the
//! headers every answer carries. Pages and `/api/` answers are built
//! elsewhere; this file only routes and refuses.
use http_body_util::BodyExt;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
};
use sqlbee_vocabulary::clock::now_unix_ms;

use super::{
    Shared, api,
    html::{self, Header, Nav},
    page_error::PageError,
    pages,
    params::{Params, View, encode},
    session::{self, Refusal},
};

/// A login form is a token and a path: anything longer is not one.
const MAX_FORM_BYTES: usize = 8 * 1024;
/// A marker is a line and a list of instances.
const MAX_MARKER_BYTES: usize = 64 * 1024;
/// A login form arrives whole within this, or the request is cut: a form
/// that trickles would hold a connection for nothing.
const FORM_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

const CSS: &str = include_str!("assets/sqlbee.css");
const JS: &str = include_str!("assets/sqlbee.js");

/// Pages run no inline script or style, load nothing from elsewhere (the
/// script fetches only its own pages again), and cannot be framed.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub type Answer = Response<String>;

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Answer {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn private(mut response: Answer) -> Answer {
    // Pages hold the fleet's data: no cache keeps a copy.
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn html_page(status: StatusCode, body: String) -> Answer {
    private(answer(status, "text/html; charset=utf-8", body))
}

/// Largest `/api/` answer, as gRPC's: `limit` bounds the rows, this the
/// bytes.
const MAX_API_ANSWER: usize = 64 * 1024 * 1024;

fn json(status: StatusCode, value: &serde_json::Value) -> Answer {
    let body = serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".into());
    if body.len() > MAX_API_ANSWER {
        let error = serde_json::json!({"error": format!(
            "the answer is {} MiB, above the {} MiB an answer may be: ask for fewer rows (`limit`) or a shorter range",
            body.len() >> 20,
            MAX_API_ANSWER >> 20
        )});
        return private(answer(StatusCode::INSUFFICIENT_STORAGE, "application/json", error.to_string()));
    }
    private(answer(status, "application/json", body))
}

fn redirect(to: &str, cookie: Option<String>) -> Answer {
    let mut response = answer(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", String::new());
    if let Ok(location) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    private(response)
}

fn header_text(request: &Request<Incoming>, name: header::HeaderName) -> Option<&str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Where to go after signing in: a path on this site only, so a crafted
/// login link cannot send anyone elsewhere. Browsers drop tabs and line
/// breaks from a URL and read a backslash as a slash, so `/\t/evil.example`
/// would leave the site: a path with a control character, a space or a
/// backslash is refused, as is one that does not start with a single `/`.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.chars().any(|c| c.is_control() || c.is_whitespace() || c == '\\') =>
        {
            path.to_string()
        }
        _ => "/".to_string(),
    }
}

/// Whether a POST comes from the UI's own pages. Browsers send `Origin`
/// with every cross-site POST; a client that sends none (curl, a script)
/// is not a browser another site could steer.
fn same_origin(request: &Request<Incoming>, secure: bool) -> bool {
    let Some(origin) = header_text(request, header::ORIGIN) else {
        return header_text(request, header::HeaderName::from_static("sec-fetch-site"))
            .is_none_or(|site| site == "same-origin" || site == "none");
    };
    let Some(host) = header_text(request, header::HOST) else { return false };
    origin == format!("{}://{host}", if secure { "https" } else { "http" })
}

/// What a spare place answers while every place of the UI is taken:
/// health, or that the UI is busy.
pub fn busy_or_healthy(method: &Method, path: &str) -> Answer {
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/healthz") => {
            answer(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into())
        }
        _ => {
            let mut busy = answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                "the web UI is busy; try again in a moment\n".into(),
            );
            busy.headers_mut().insert(header::RETRY_AFTER, hyper::header::HeaderValue::from_static("5"));
            busy
        }
    }
}

pub async fn respond(ui: Shared, request: Request<Incoming>, peer: std::net::IpAddr) -> Answer {
    let path = request.uri().path().to_string();
    let params = Params::parse(request.uri().query().unwrap_or(""));
    let method = request.method().clone();
    if path != "/healthz" && !ui.answers_host(header_text(&request, header::HOST)) {
        tracing::info!(%peer, host = header_text(&request, header::HOST).unwrap_or(""), "web UI: refused a request for another host name");
        return answer(
            StatusCode::MISDIRECTED_REQUEST,
            "text/plain; charset=utf-8",
            "this web UI answers to its IP addresses, localhost and the names given with --http-host\n".into(),
        );
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => return answer(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
        (&Method::GET, "/static/sqlbee.css") => return answer(StatusCode::OK, "text/css; charset=utf-8", CSS.into()),
        (&Method::GET, "/static/sqlbee.js") => {
            return answer(StatusCode::OK, "text/javascript; charset=utf-8", JS.into());
        }
        (&Method::GET, "/favicon.ico") => return answer(StatusCode::NOT_FOUND, "text/plain", String::new()),
        (&Method::GET, "/login") => {
            return html_page(StatusCode::OK, pages::login::render(&safe_next(params.get("next")), None));
        }
        (&Method::POST, "/login" | "/logout") if !same_origin(&request, ui.secure) => {
            tracing::info!(%peer, %path, "web UI: refused a form posted from another site");
            return answer(StatusCode::FORBIDDEN, "text/plain; charset=utf-8", "cross-site form refused\n".into());
        }
        (&Method::POST, "/login") => return login(&ui, request, peer).await,
        (&Method::POST, "/api/annotations") => return annotate(&ui, request, peer).await,
        (&Method::POST, "/logout") => {
            ui.sessions.sign_out(header_text(&request, header::COOKIE));
            return redirect("/login", Some(session::close_cookie(ui.secure)));
        }
        _ => {}
    }

    let api = path.starts_with("/api/");
    if let Err(refusal) =
        ui.sessions.admit(header_text(&request, header::AUTHORIZATION), header_text(&request, header::COOKIE), peer)
    {
        return match (api, refusal) {
            (true, Refusal::SignIn) => json(
                StatusCode::UNAUTHORIZED,
                &serde_json::json!({"error": "this collector requires a read token: `Authorization: Bearer <token>`"}),
            ),
            (true, Refusal::Refused(why)) => json(StatusCode::UNAUTHORIZED, &serde_json::json!({"error": why})),
            (false, Refusal::SignIn) => {
                let back = request.uri().path_and_query().map_or("/".to_string(), |p| p.to_string());
                redirect(&format!("/login?next={}", encode(&back)), None)
            }
            (false, Refusal::Refused(why)) => {
                html_page(StatusCode::UNAUTHORIZED, pages::login::render(&safe_next(Some(&path)), Some(&why)))
            }
            (_, Refusal::Throttled(wait)) => throttled(wait),
        };
    }
    if method != Method::GET {
        return answer(StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "only GET here\n".into());
    }
    super::turns::as_reader(peer, read(&ui, &path, &params)).await
}

/// A page or an `/api/` answer, for a reader already admitted.
async fn read(ui: &Shared, path: &str, params: &Params) -> Answer {
    let now = now_unix_ms();
    if path.starts_with("/api/") {
        return match api::answer(ui, path, params, now).await {
            Some(Ok(value)) => json(StatusCode::OK, &value),
            Some(Err(error)) => json(error.status(), &serde_json::json!({"error": error.to_string()})),
            None => json(StatusCode::NOT_FOUND, &serde_json::json!({"error": format!("no endpoint {path}")})),
        };
    }
    let signed_in = ui.sessions.required();
    let view = match View::from(params, now) {
        Ok(view) => view,
        Err(bad) => return error_page(path, signed_in, &PageError::Bad(bad)),
    };
    match pages::render(ui, path, &view, params, now, signed_in).await {
        Some(Ok(body)) => html_page(StatusCode::OK, body),
        Some(Err(error)) => error_page(path, signed_in, &error),
        None => html_page(
            StatusCode::NOT_FOUND,
            html::page(
                &Header { title: "Not found", nav: Nav::Fleet, path, view: None, instances: &[], keep: &[], signed_in },
                &html::notice(&format!("There is no page at {path}.")),
            ),
        ),
    }
}

/// 429 for an address that had too many tokens refused in its minute.
fn throttled(wait: std::time::Duration) -> Answer {
    let mut refused = answer(
        StatusCode::TOO_MANY_REQUESTS,
        "text/plain; charset=utf-8",
        "too many refused tokens from this address; try again in a minute\n".into(),
    );
    if let Ok(seconds) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
        refused.headers_mut().insert(header::RETRY_AFTER, seconds);
    }
    refused
}

/// `POST /api/annotations`: a marker, with a token of the `annotate` role
/// (not a session: a CI job posts it). The body must be JSON, which a
/// form on another site cannot send without the browser asking first.
async fn annotate(ui: &Shared, request: Request<Incoming>, peer: std::net::IpAddr) -> Answer {
    let refuse = |error: PageError| json(error.status(), &serde_json::json!({"error": error.to_string()}));
    let header = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let token = match ui.auth.check_from(crate::auth::Role::Annotate, header, Some(peer), "http") {
        Ok(caller) => caller.map_or(0, |c| c.token),
        Err(status) => {
            tracing::debug!(%peer, reason = status.message(), "web UI: marker refused");
            return refuse(PageError::Query(status));
        }
    };
    let json_body =
        header_text(&request, header::CONTENT_TYPE).is_some_and(|t| t.trim_start().starts_with("application/json"));
    if !json_body {
        return json(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &serde_json::json!({"error": "send the marker as JSON: `Content-Type: application/json`"}),
        );
    }
    let limited = http_body_util::Limited::new(request.into_body(), MAX_MARKER_BYTES);
    let body = match tokio::time::timeout(FORM_DEADLINE, limited.collect()).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) => {
            return json(
                StatusCode::PAYLOAD_TOO_LARGE,
                &serde_json::json!({"error": format!("a marker is at most {MAX_MARKER_BYTES} bytes")}),
            );
        }
        Err(_) => return json(StatusCode::REQUEST_TIMEOUT, &serde_json::json!({"error": "the body was too slow"})),
    };
    let marker = match api::marker_request(&body) {
        Ok(marker) => marker,
        Err(bad) => return refuse(PageError::Bad(bad)),
    };
    match ui.annotate.annotate(marker, now_unix_ms(), token).await {
        Ok(stored) => json(StatusCode::CREATED, &sqlbee_proto::json::annotations_json(&[stored])),
        Err(status) => refuse(PageError::Query(status)),
    }
}

/// The answer to a request that ran past its deadline.
pub fn too_slow(deadline: std::time::Duration) -> Answer {
    let mut response = answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        format!(
            "the collector could not answer within {} s; ask for a shorter range or fewer rows\n",
            deadline.as_secs()
        ),
    );
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    private(response)
}

fn error_page(path: &str, signed_in: bool, error: &PageError) -> Answer {
    let body = html::page(
        &Header {
            title: "Cannot show this page",
            nav: Nav::Fleet,
            path,
            view: None,
            instances: &[],
            keep: &[],
            signed_in,
        },
        &html::notice(&error.to_string()),
    );
    html_page(error.status(), body)
}

async fn login(ui: &Shared, request: Request<Incoming>, peer: std::net::IpAddr) -> Answer {
    if let Some(wait) = ui.auth.refused_wait(peer) {
        let mut refused = html_page(
            StatusCode::TOO_MANY_REQUESTS,
            pages::login::render("/", Some("too many refused sign-ins from this address; try again in a minute")),
        );
        if let Ok(seconds) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            refused.headers_mut().insert(header::RETRY_AFTER, seconds);
        }
        return refused;
    }
    let limited = http_body_util::Limited::new(request.into_body(), MAX_FORM_BYTES);
    let form = match tokio::time::timeout(FORM_DEADLINE, limited.collect()).await {
        Ok(Ok(body)) => Params::parse(&String::from_utf8_lossy(&body.to_bytes())),
        Ok(Err(_)) => {
            return html_page(StatusCode::PAYLOAD_TOO_LARGE, pages::login::render("/", Some("the form is too large")));
        }
        Err(_) => {
            tracing::debug!(%peer, "web UI: a sign-in form did not arrive in time");
            let mut cut = answer(StatusCode::REQUEST_TIMEOUT, "text/plain; charset=utf-8", "form too slow\n".into());
            cut.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return cut;
        }
    };
    let next = safe_next(form.get("next"));
    // A refused token is counted (and logged) by the token check itself.
    match ui.sessions.sign_in(form.get("token").unwrap_or(""), peer) {
        Ok(Ok(id)) => redirect(&next, Some(session::open_cookie(&id, ui.secure))),
        Ok(Err(refusal)) => {
            let why = match refusal {
                Refusal::Refused(why) => why,
                Refusal::SignIn => "token refused".to_string(),
                Refusal::Throttled(wait) => return throttled(wait),
            };
            html_page(StatusCode::UNAUTHORIZED, pages::login::render(&next, Some(&why)))
        }
        Err(error) => {
            tracing::warn!(%error, "web UI: cannot open a session");
            html_page(StatusCode::INTERNAL_SERVER_ERROR, pages::login::render(&next, Some(&error.to_string())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_a_plain_path_on_this_site_or_the_fleet_page() {
        let next = |query: &str| safe_next(Params::parse(query).get("next"));
        assert_eq!(next("next=/top%3Fsince%3D6h"), "/top?since=6h");
        assert_eq!(next("next=/digest?id=1"), "/digest?id=1");
        for elsewhere in [
            "next=//evil.example/",
            "next=/%09/evil.example",
            "next=/%0a/evil.example",
            "next=/%5Cevil.example",
            "next=%5C%5Cevil.example",
            "next=/%20/evil.example",
            "next=https://evil.example/",
            "next=evil.example",
        ] {
            assert_eq!(next(elsewhere), "/", "{elsewhere}");
        }
    }
}
