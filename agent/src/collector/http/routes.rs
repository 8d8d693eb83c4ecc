//! One request in, one response out: the paths, who may see them, and the
//! headers every answer carries. Pages and `/api/` answers are built
//! elsewhere; this file only routes and refuses.
use http_body_util::BodyExt;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
};
use sqlbee_common::clock::now_unix_ms;

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

const CSS: &str = include_str!("assets/sqlbee.css");
const JS: &str = include_str!("assets/sqlbee.js");

/// Pages run no inline script or style, load nothing from elsewhere, and
/// cannot be framed.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
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

fn json(status: StatusCode, value: &serde_json::Value) -> Answer {
    let body = serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".into());
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
/// login link cannot send anyone elsewhere.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(path) if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') => path.to_string(),
        _ => "/".to_string(),
    }
}

pub async fn respond(ui: Shared, request: Request<Incoming>) -> Answer {
    let path = request.uri().path().to_string();
    let params = Params::parse(request.uri().query().unwrap_or(""));
    let method = request.method().clone();
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
        (&Method::POST, "/login") => return login(&ui, request).await,
        (&Method::POST, "/logout") => {
            ui.sessions.sign_out(header_text(&request, header::COOKIE));
            return redirect("/login", Some(session::close_cookie(ui.secure)));
        }
        _ => {}
    }

    let api = path.starts_with("/api/");
    if let Err(refusal) =
        ui.sessions.admit(header_text(&request, header::AUTHORIZATION), header_text(&request, header::COOKIE))
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
        };
    }
    if method != Method::GET {
        return answer(StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "only GET here\n".into());
    }

    let now = now_unix_ms();
    if api {
        return match api::answer(&ui, &path, &params, now).await {
            Some(Ok(value)) => json(StatusCode::OK, &value),
            Some(Err(error)) => json(error.status(), &serde_json::json!({"error": error.to_string()})),
            None => json(StatusCode::NOT_FOUND, &serde_json::json!({"error": format!("no endpoint {path}")})),
        };
    }
    let signed_in = ui.sessions.required();
    let view = match View::from(&params, now) {
        Ok(view) => view,
        Err(bad) => return error_page(&path, signed_in, &PageError::Bad(bad)),
    };
    match pages::render(&ui, &path, &view, &params, now, signed_in).await {
        Some(Ok(body)) => html_page(StatusCode::OK, body),
        Some(Err(error)) => error_page(&path, signed_in, &error),
        None => html_page(
            StatusCode::NOT_FOUND,
            html::page(
                &Header {
                    title: "Not found",
                    nav: Nav::Fleet,
                    path: &path,
                    view: None,
                    instances: &[],
                    keep: &[],
                    signed_in,
                },
                &html::notice(&format!("There is no page at {path}.")),
            ),
        ),
    }
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

async fn login(ui: &Shared, request: Request<Incoming>) -> Answer {
    let limited = http_body_util::Limited::new(request.into_body(), MAX_FORM_BYTES);
    let form = match limited.collect().await {
        Ok(body) => Params::parse(&String::from_utf8_lossy(&body.to_bytes())),
        Err(_) => {
            return html_page(StatusCode::PAYLOAD_TOO_LARGE, pages::login::render("/", Some("the form is too large")));
        }
    };
    let next = safe_next(form.get("next"));
    match ui.sessions.sign_in(form.get("token").unwrap_or("")) {
        Ok(Ok(id)) => redirect(&next, Some(session::open_cookie(&id, ui.secure))),
        Ok(Err(refusal)) => {
            let why = match refusal {
                Refusal::Refused(why) => why,
                Refusal::SignIn => "token refused".to_string(),
            };
            tracing::info!(reason = %why, "web UI: sign-in refused");
            html_page(StatusCode::UNAUTHORIZED, pages::login::render(&next, Some(&why)))
        }
        Err(error) => {
            tracing::warn!(%error, "web UI: cannot open a session");
            html_page(StatusCode::INTERNAL_SERVER_ERROR, pages::login::render(&next, Some(&error.to_string())))
        }
    }
}
