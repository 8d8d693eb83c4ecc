//! How the agent reaches its collector: URL, optional bearer token, TLS or
//! mutual TLS from PEM files.
use std::path::{Path, PathBuf};

use tonic::{
    metadata::MetadataValue,
    service::Interceptor,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use super::ShipError;

#[derive(Clone, Debug, Default)]
pub struct ShipTarget {
    pub url: String,
    pub token_file: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, ShipError> {
    std::fs::read(path).map_err(|source| ShipError::State { path: path.to_path_buf(), source })
}

impl ShipTarget {
    /// A channel that connects on first use and reconnects by itself.
    pub fn channel(&self) -> Result<Channel, ShipError> {
        let bad = |reason: String| ShipError::Target { url: self.url.clone(), reason };
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(std::time::Duration::from_secs(5))
            .tcp_nodelay(true);
        if self.url.starts_with("https://") || self.ca_cert.is_some() {
            let mut tls = ClientTlsConfig::new().with_enabled_roots();
            if let Some(ca) = &self.ca_cert {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            match (&self.client_cert, &self.client_key) {
                (Some(cert), Some(key)) => tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?)),
                (None, None) => {}
                _ => return Err(bad("--client-cert and --client-key go together".into())),
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| bad(e.to_string()))?;
        }
        Ok(endpoint.connect_lazy())
    }

    pub fn token(&self) -> BearerToken {
        let token = self
            .token_file
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| t.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).map(String::from))
            .and_then(|t| MetadataValue::try_from(format!("Bearer {t}")).ok());
        BearerToken(token)
    }
}

/// Adds `authorization: Bearer <token>` to every request when configured.
#[derive(Clone)]
pub struct BearerToken(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}
