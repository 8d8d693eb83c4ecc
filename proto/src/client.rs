//! A gRPC channel to a collector: plain, TLS, or mTLS, plus the bearer
//! token. Independent of any command line so the CLI, the agent's ship
//! stage and tests build channels the same way.
//!
//! ```ignore
//! let opts = ClientOptions { url: "https://collector:7878".into(), token: Some(t), ca_cert: Some(ca), ..Default::default() };
//! let channel = client::connect(&opts).await?;          // or client::endpoint(&opts)?.connect_lazy()
//! let mut ingest = IngestClient::with_interceptor(channel, BearerToken::new(opts.token.as_deref())?);
//! ```
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use sqlbee_vocabulary::error_chain;
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    service::Interceptor,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// http://HOST:PORT or https://HOST:PORT.
    pub url: String,
    /// Sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// CA (PEM) that signed the collector's certificate; needed for https.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate and key (PEM) for a collector that requires mTLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Name to check the collector's certificate against, when it differs
    /// from the URL's host.
    pub tls_domain: Option<String>,
    /// Default 5 s.
    pub connect_timeout: Option<Duration>,
    /// Per request; default none.
    pub request_timeout: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("collector URL {url:?} must start with http:// or https://")]
    Scheme { url: String },
    #[error("invalid collector URL {url:?}: {source}")]
    Url {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{url} uses TLS and needs a CA certificate (--ca-cert): this build trusts no system roots")]
    NoCa { url: String },
    #[error("a CA or client certificate was given but the collector URL {url} is not https://")]
    TlsWithoutHttps { url: String },
    #[error("a client certificate needs its key and the key its certificate (--client-cert with --client-key)")]
    HalfIdentity,
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the token file {path} has no token (one line; lines starting with # are comments)")]
    EmptyTokenFile { path: String },
    #[error("the bearer token must be printable ASCII without spaces")]
    BadToken,
    // tonic's transport errors say only "transport error" at the top, so
    // these two carry the whole chain in their message instead of a source.
    #[error("TLS setup failed (are the PEM files valid?): {}", error_chain(cause))]
    Tls { cause: tonic::transport::Error },
    #[error("cannot connect to the collector at {url}: {}", error_chain(cause))]
    Connect { url: String, cause: tonic::transport::Error },
}

fn read(path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|source| ClientError::Read { path: path.display().to_string(), source })
}

/// The first token line of a file (blank lines and `#` comments skipped),
/// the same format as the collector's --tokens file.
pub fn read_token_file(path: &Path) -> Result<String, ClientError> {
    let text = String::from_utf8_lossy(&read(path)?).into_owned();
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .ok_or_else(|| ClientError::EmptyTokenFile { path: path.display().to_string() })
}

pub fn endpoint(opts: &ClientOptions) -> Result<Endpoint, ClientError> {
    let tls = opts.url.starts_with("https://");
    if !tls && !opts.url.starts_with("http://") {
        return Err(ClientError::Scheme { url: opts.url.clone() });
    }
    if opts.client_cert.is_some() != opts.client_key.is_some() {
        return Err(ClientError::HalfIdentity);
    }
    let mut endpoint = Endpoint::from_shared(opts.url.clone())
        .map_err(|source| ClientError::Url { url: opts.url.clone(), source })?
        .connect_timeout(opts.connect_timeout.unwrap_or(Duration::from_secs(5)))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if let Some(timeout) = opts.request_timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if !tls {
        if opts.ca_cert.is_some() || opts.client_cert.is_some() {
            return Err(ClientError::TlsWithoutHttps { url: opts.url.clone() });
        }
        return Ok(endpoint);
    }
    let ca = opts.ca_cert.as_ref().ok_or_else(|| ClientError::NoCa { url: opts.url.clone() })?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (&opts.client_cert, &opts.client_key) {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(domain) = &opts.tls_domain {
        config = config.domain_name(domain.clone());
    }
    endpoint.tls_config(config).map_err(|cause| ClientError::Tls { cause })
}

/// Connects now, so a wrong address or a refused TLS handshake is reported
/// here rather than at the first call.
pub async fn connect(opts: &ClientOptions) -> Result<Channel, ClientError> {
    endpoint(opts)?.connect().await.map_err(|cause| ClientError::Connect { url: opts.url.clone(), cause })
}

/// Adds `authorization: Bearer <token>` to every request (nothing when
/// there is no token). Use with `XClient::with_interceptor(channel, ..)`.
#[derive(Clone, Debug, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl BearerToken {
    pub fn new(token: Option<&str>) -> Result<BearerToken, ClientError> {
        match token {
            None => Ok(BearerToken(None)),
            Some(t) if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) => Err(ClientError::BadToken),
            Some(t) => format!("Bearer {t}").parse().map(|v| BearerToken(Some(v))).map_err(|_| ClientError::BadToken),
        }
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let opts = |url: &str| ClientOptions { url: url.into(), ..Default::default() };
        assert!(matches!(endpoint(&opts("ftp://x")), Err(ClientError::Scheme { .. })));
        assert!(matches!(endpoint(&opts("https://x:1")), Err(ClientError::NoCa { .. })));
        endpoint(&opts("http://127.0.0.1:1")).unwrap();
        let mut o = opts("http://127.0.0.1:1");
        o.ca_cert = Some("/nonexistent".into());
        assert!(matches!(endpoint(&o), Err(ClientError::TlsWithoutHttps { .. })));
        o.client_cert = Some("/c".into());
        assert!(matches!(endpoint(&o), Err(ClientError::HalfIdentity)));
        assert!(BearerToken::new(Some("has space")).is_err());
        let mut t = BearerToken::new(Some("abc")).unwrap();
        let r = t.call(Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer abc");
    }
}
