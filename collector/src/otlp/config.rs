//! Where and how each signal is sent: the collector's `--otlp-*` flags
//! over the standard `OTEL_EXPORTER_OTLP_*` variables (the signal's own,
//! such as `OTEL_EXPORTER_OTLP_LOGS_HEADERS`, before the general one, as
//! the OTLP exporter specification orders them), validated once at start.
use std::{path::PathBuf, time::Duration};

/// What is sent: each signal has its own target and its own mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Metrics,
    Logs,
}

impl Signal {
    pub const ALL: [Signal; 2] = [Signal::Metrics, Signal::Logs];

    pub fn name(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// The variables' infix (`OTEL_EXPORTER_OTLP_<infix>_ENDPOINT`).
    fn infix(self) -> &'static str {
        match self {
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
        }
    }
}

/// How requests travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Protobuf bodies POSTed to `/v1/metrics` and `/v1/logs` under the
    /// endpoint: the specification's default.
    HttpProtobuf,
    /// The services' `Export` calls over gRPC.
    Grpc,
}

impl Protocol {
    pub fn parse(text: &str) -> Result<Protocol, ConfigError> {
        match text.trim() {
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "grpc" => Ok(Protocol::Grpc),
            other => Err(ConfigError::Protocol { value: other.to_string() }),
        }
    }
}

/// Where one signal is sent, resolved.
#[derive(Clone, Debug)]
pub struct Target {
    pub signal: Signal,
    pub protocol: Protocol,
    /// The URL requests go to: for HTTP the signal's URL itself
    /// (`/v1/metrics` or `/v1/logs` under a base), for gRPC the server's.
    pub url: String,
    /// Sent with every request (authentication, tenants).
    pub headers: Vec<(String, String)>,
    /// One request's whole deadline.
    pub timeout: Duration,
    /// CA (PEM) that signed the receiver's certificate.
    pub ca: Option<PathBuf>,
}

impl Target {
    /// The URL without a password it may carry (`https://user:pass@host`),
    /// for logs and errors.
    pub fn shown_url(&self) -> String {
        let Some((scheme, rest)) = self.url.split_once("://") else { return self.url.clone() };
        let authority_end = rest.find('/').unwrap_or(rest.len());
        match rest[..authority_end].rfind('@') {
            Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
            None => self.url.clone(),
        }
    }
}

/// The flags, before the environment fills what they leave out.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    pub headers: Vec<String>,
    pub ca: Option<PathBuf>,
    pub timeout: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("OTLP protocol {value:?}: expected http/protobuf or grpc (http/json is not sent)")]
    Protocol { value: String },
    #[error("OTLP endpoint {url:?}: expected an http:// or https:// URL")]
    Scheme { url: String },
    #[error("OTLP header {entry:?}: expected KEY=VALUE")]
    Header { entry: String },
    #[error("{variable}={value:?}: expected a whole number of milliseconds")]
    Timeout { variable: String, value: String },
}

/// The signal's variable `what`, else the general one, when set and not
/// empty: (its name, its value).
fn env(signal: Signal, what: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Option<(String, String)> {
    [format!("OTEL_EXPORTER_OTLP_{}_{what}", signal.infix()), format!("OTEL_EXPORTER_OTLP_{what}")]
        .into_iter()
        .find_map(|name| lookup(&name).filter(|v| !v.trim().is_empty()).map(|v| (name, v)))
}

/// The signal's target, or None when neither a flag nor the environment
/// names an endpoint for it (not sent). `lookup` reads the environment
/// (tests pass their own).
pub fn resolve(
    flags: &Flags,
    signal: Signal,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Target>, ConfigError> {
    let protocol = match (&flags.protocol, env(signal, "PROTOCOL", lookup)) {
        (Some(p), _) => Protocol::parse(p)?,
        (None, Some((_, p))) => Protocol::parse(&p)?,
        (None, None) => Protocol::HttpProtobuf,
    };
    // A signal's own endpoint is the URL itself; the general one is a
    // base that HTTP appends the signal's path to.
    let own = lookup(&format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.infix())).filter(|v| !v.trim().is_empty());
    let (base, whole) = match (&flags.endpoint, own) {
        (Some(url), _) => (url.clone(), false),
        (None, Some(url)) => (url, true),
        (None, None) => match lookup("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.trim().is_empty()) {
            Some(url) => (url, false),
            None => return Ok(None),
        },
    };
    let base = base.trim().to_string();
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(ConfigError::Scheme { url: base });
    }
    let url = match protocol {
        Protocol::HttpProtobuf if !whole => format!("{}/v1/{}", base.trim_end_matches('/'), signal.name()),
        _ => base,
    };
    let mut headers = Vec::new();
    if let Some((_, list)) = env(signal, "HEADERS", lookup) {
        for entry in list.split(',').filter(|e| !e.trim().is_empty()) {
            headers.push(header(entry, true)?);
        }
    }
    for entry in &flags.headers {
        let (key, value) = header(entry, false)?;
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
        headers.push((key, value));
    }
    let timeout = match (flags.timeout, env(signal, "TIMEOUT", lookup)) {
        (Some(t), _) => t,
        (None, Some((variable, value))) => Duration::from_millis(
            value.trim().parse().map_err(|_| ConfigError::Timeout { variable, value: value.clone() })?,
        ),
        (None, None) => Duration::from_secs(10),
    };
    let ca = flags.ca.clone().or_else(|| env(signal, "CERTIFICATE", lookup).map(|(_, p)| PathBuf::from(p)));
    Ok(Some(Target { signal, protocol, url, headers, timeout, ca }))
}

/// `KEY=VALUE`; the variables' values are percent-encoded (W3C baggage's
/// format, as the specification says), the flag's are taken as written.
fn header(entry: &str, encoded: bool) -> Result<(String, String), ConfigError> {
    let bad = || ConfigError::Header { entry: entry.to_string() };
    let (key, value) = entry.split_once('=').ok_or_else(bad)?;
    let key = key.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(bad());
    }
    let value = if encoded {
        sqlbee_vocabulary::percent::decode(value.trim()).ok_or_else(bad)?
    } else {
        value.trim().to_string()
    };
    if value.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(bad());
    }
    Ok((key.to_ascii_lowercase(), value))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve_with(flags: &Flags, vars: &[(&str, &str)]) -> Result<Option<Target>, ConfigError> {
        resolve_signal(flags, Signal::Metrics, vars)
    }

    fn resolve_signal(flags: &Flags, signal: Signal, vars: &[(&str, &str)]) -> Result<Option<Target>, ConfigError> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        resolve(flags, signal, &|name| vars.get(name).cloned())
    }

    #[test]
    fn each_signal_has_its_own_path_and_variables() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "tenant=logs"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "tenant=all"),
        ];
        let logs = resolve_signal(&Flags::default(), Signal::Logs, &vars).unwrap().unwrap();
        assert_eq!(logs.url, "http://otel:4318/v1/logs");
        assert_eq!(logs.headers, vec![("tenant".into(), "logs".into())]);
        let metrics = resolve_signal(&Flags::default(), Signal::Metrics, &vars).unwrap().unwrap();
        assert_eq!(metrics.headers, vec![("tenant".into(), "all".into())]);
        // A metrics-only endpoint sends no logs.
        let only = [("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://otel:4318/v1/metrics")];
        assert!(resolve_signal(&Flags::default(), Signal::Logs, &only).unwrap().is_none());
    }

    #[test]
    fn a_password_in_the_url_is_not_shown() {
        let flags = Flags { endpoint: Some("https://u:secret@otel:4318/base".into()), ..Flags::default() };
        let target = resolve_with(&flags, &[]).unwrap().unwrap();
        assert_eq!(target.shown_url(), "https://otel:4318/base/v1/metrics");
        assert_eq!(target.url, "https://u:secret@otel:4318/base/v1/metrics");
    }

    #[test]
    fn nothing_named_means_no_export() {
        assert!(resolve_with(&Flags::default(), &[("OTEL_EXPORTER_OTLP_HEADERS", "a=b")]).unwrap().is_none());
    }

    #[test]
    fn the_general_endpoint_is_a_base_and_the_metrics_one_is_whole() {
        let base = resolve_with(&Flags::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318/")]).unwrap();
        assert_eq!(base.unwrap().url, "http://otel:4318/v1/metrics");
        let whole = resolve_with(
            &Flags::default(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"), ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://b/m")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(whole.url, "http://b/m");
        let flag = Flags { endpoint: Some("https://c:4318".into()), ..Flags::default() };
        assert_eq!(
            resolve_with(&flag, &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://b/m")]).unwrap().unwrap().url,
            "https://c:4318/v1/metrics"
        );
    }

    #[test]
    fn grpc_keeps_the_url_and_the_flags_win() {
        let flags = Flags {
            endpoint: Some("http://otel:4317".into()),
            protocol: Some("grpc".into()),
            headers: vec!["X-Tenant=blue".into()],
            ..Flags::default()
        };
        let target = resolve_with(
            &flags,
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=red,api-key=a%20b%3D"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(target.protocol, Protocol::Grpc);
        assert_eq!(target.url, "http://otel:4317");
        assert_eq!(target.headers, vec![("api-key".into(), "a b=".into()), ("x-tenant".into(), "blue".into())]);
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let flags = Flags { endpoint: Some("otel:4318".into()), ..Flags::default() };
        assert!(matches!(resolve_with(&flags, &[]), Err(ConfigError::Scheme { .. })));
        let flags =
            Flags { endpoint: Some("http://otel".into()), protocol: Some("http/json".into()), ..Flags::default() };
        assert!(matches!(resolve_with(&flags, &[]), Err(ConfigError::Protocol { .. })));
        let flags = Flags { endpoint: Some("http://otel".into()), headers: vec!["novalue".into()], ..Flags::default() };
        assert!(matches!(resolve_with(&flags, &[]), Err(ConfigError::Header { .. })));
        let flags = Flags { endpoint: Some("http://otel".into()), ..Flags::default() };
        assert!(matches!(
            resolve_with(&flags, &[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]),
            Err(ConfigError::Timeout { variable, .. }) if variable == "OTEL_EXPORTER_OTLP_TIMEOUT"
        ));
        assert!(matches!(
            resolve_with(&flags, &[("OTEL_EXPORTER_OTLP_HEADERS", "a=%zz")]),
            Err(ConfigError::Header { .. })
        ));
    }
}
