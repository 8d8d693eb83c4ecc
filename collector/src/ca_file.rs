//! A CA file (PEM) the collector trusts as a client, as its HTTP client
//! takes it: for ClickHouse's servers and for the OTLP receiver.
use std::{path::Path, sync::Arc};

#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error("cannot read the CA file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA file {path} holds no PEM certificate")]
    Empty { path: String },
}

/// The certificates of `path`, as the only roots to trust.
pub fn roots(path: &Path) -> Result<ureq::tls::RootCerts, CaFileError> {
    let shown = path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| CaFileError::Read { path: shown.clone(), source })?;
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(CaFileError::Empty { path: shown });
    }
    Ok(ureq::tls::RootCerts::Specific(Arc::new(certs)))
}
