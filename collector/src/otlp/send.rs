//! One export request to the receiver, over HTTP (protobuf body) or gRPC,
//! and what its answer means: accepted (perhaps in part), worth retrying,
//! or refused for good. Which failures are retried follows the OTLP
//! specification: over HTTP 429, 502, 503 and 504 and anything that never
//! got an answer; over gRPC the codes it lists as retryable.
use std::{sync::Arc, time::Duration};

use prost::Message as _;
use tonic::codegen::http::uri::PathAndQuery;

use super::{
    config::{Protocol, Target},
    wire::{ExportMetricsServiceRequest, ExportMetricsServiceResponse},
};

const GRPC_METRICS_EXPORT: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The receiver took the request; it may have refused some points.
#[derive(Debug, Default)]
pub struct Accepted {
    pub rejected_points: u64,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct SendError {
    /// The same request may succeed later.
    pub retryable: bool,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("OTLP CA {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("OTLP endpoint: {0}")]
    Grpc(#[from] sqlbee_proto::client::ClientError),
    #[error("OTLP header {key:?}: not a valid header")]
    Header { key: String },
}

#[derive(Clone)]
pub enum Transport {
    Http { agent: ureq::Agent, target: Arc<Target> },
    Grpc { channel: tonic::transport::Channel, target: Arc<Target> },
}

impl Transport {
    pub fn new(target: Target) -> Result<Transport, TransportError> {
        match target.protocol {
            Protocol::HttpProtobuf => {
                let mut tls = ureq::tls::TlsConfig::builder();
                if let Some(path) = &target.ca {
                    let shown = path.display().to_string();
                    let pem = std::fs::read(path)
                        .map_err(|e| TransportError::Ca { path: shown.clone(), reason: e.to_string() })?;
                    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                        .filter_map(|item| match item {
                            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
                            _ => None,
                        })
                        .collect();
                    if certs.is_empty() {
                        return Err(TransportError::Ca { path: shown, reason: "holds no certificate".into() });
                    }
                    tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)));
                }
                let agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(target.timeout))
                    .timeout_connect(Some(Duration::from_secs(5).min(target.timeout)))
                    .tls_config(tls.build())
                    .build()
                    .new_agent();
                Ok(Transport::Http { agent, target: Arc::new(target) })
            }
            Protocol::Grpc => {
                for (key, value) in &target.headers {
                    let bad = || TransportError::Header { key: key.clone() };
                    key.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>().map_err(|_| bad())?;
                    value.parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>().map_err(|_| bad())?;
                }
                let endpoint = sqlbee_proto::client::endpoint(&sqlbee_proto::client::ClientOptions {
                    url: target.url.clone(),
                    ca_cert: target.ca.clone(),
                    request_timeout: Some(target.timeout),
                    ..Default::default()
                })?;
                Ok(Transport::Grpc { channel: endpoint.connect_lazy(), target: Arc::new(target) })
            }
        }
    }

    pub async fn export(&self, request: ExportMetricsServiceRequest) -> Result<Accepted, SendError> {
        match self {
            Transport::Http { agent, target } => {
                let (agent, target) = (agent.clone(), target.clone());
                tokio::task::spawn_blocking(move || post(&agent, &target, &request.encode_to_vec()))
                    .await
                    .map_err(|e| SendError { retryable: true, reason: format!("export task failed: {e}") })?
            }
            Transport::Grpc { channel, target } => call(channel.clone(), target, request).await,
        }
    }
}

fn post(agent: &ureq::Agent, target: &Target, body: &[u8]) -> Result<Accepted, SendError> {
    let mut request = agent.post(&target.url).header("content-type", "application/x-protobuf");
    for (key, value) in &target.headers {
        request = request.header(key, value);
    }
    let mut answer =
        request.send(body).map_err(|e| SendError { retryable: true, reason: format!("POST {}: {e}", target.url) })?;
    let status = answer.status().as_u16();
    let bytes = answer.body_mut().with_config().limit(1 << 20).read_to_vec().unwrap_or_default();
    if (200..300).contains(&status) {
        return Ok(accepted(&bytes));
    }
    // The receiver's reason is a google.rpc.Status: its message (field 2)
    // is what a person reads; the status alone says enough otherwise.
    let reason = format!("POST {} answered {status}{}", target.url, status_message(&bytes));
    Err(SendError { retryable: matches!(status, 429 | 502 | 503 | 504), reason })
}

fn accepted(bytes: &[u8]) -> Accepted {
    match ExportMetricsServiceResponse::decode(bytes).ok().and_then(|r| r.partial_success) {
        Some(p) => Accepted { rejected_points: p.rejected_data_points.max(0) as u64, message: p.error_message },
        None => Accepted::default(),
    }
}

fn status_message(bytes: &[u8]) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(string, tag = "2")]
        message: String,
    }
    match RpcStatus::decode(bytes) {
        Ok(s) if !s.message.is_empty() => format!(": {}", s.message.chars().take(300).collect::<String>()),
        _ => String::new(),
    }
}

async fn call(
    channel: tonic::transport::Channel,
    target: &Target,
    request: ExportMetricsServiceRequest,
) -> Result<Accepted, SendError> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| SendError {
        retryable: true,
        reason: format!("{}: {}", target.url, sqlbee_vocabulary::error_chain(&e)),
    })?;
    let mut request = tonic::Request::new(request);
    for (key, value) in &target.headers {
        // Checked when the transport was made.
        if let (Ok(k), Ok(v)) = (key.parse::<tonic::metadata::MetadataKey<_>>(), value.parse()) {
            request.metadata_mut().insert(k, v);
        }
    }
    let codec = tonic_prost::ProstCodec::<ExportMetricsServiceRequest, ExportMetricsServiceResponse>::default();
    match grpc.unary(request, PathAndQuery::from_static(GRPC_METRICS_EXPORT), codec).await {
        Ok(answer) => {
            let answer = answer.into_inner();
            Ok(match answer.partial_success {
                Some(p) => Accepted { rejected_points: p.rejected_data_points.max(0) as u64, message: p.error_message },
                None => Accepted::default(),
            })
        }
        Err(status) => {
            use tonic::Code::*;
            let retryable = matches!(
                status.code(),
                Cancelled | DeadlineExceeded | ResourceExhausted | Aborted | OutOfRange | Unavailable | DataLoss
            );
            Err(SendError {
                retryable,
                reason: format!(
                    "{}: {:?}: {}",
                    target.url,
                    status.code(),
                    status.message().chars().take(300).collect::<String>()
                ),
            })
        }
    }
}
