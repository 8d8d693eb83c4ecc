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
    wire::{
        ExportLogsServiceRequest, ExportLogsServiceResponse, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    },
};

const GRPC_METRICS_EXPORT: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
const GRPC_LOGS_EXPORT: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";

/// One export request, of either signal.
#[derive(Clone, Debug)]
pub enum Request {
    Metrics(ExportMetricsServiceRequest),
    Logs(ExportLogsServiceRequest),
}

/// The receiver took the request; it may have refused some of its items
/// (data points, log records).
#[derive(Debug, Default)]
pub struct Accepted {
    pub rejected: u64,
    pub message: String,
}

impl From<ExportMetricsServiceResponse> for Accepted {
    fn from(answer: ExportMetricsServiceResponse) -> Accepted {
        answer
            .partial_success
            .map(|p| Accepted { rejected: p.rejected_data_points.max(0) as u64, message: p.error_message })
            .unwrap_or_default()
    }
}

impl From<ExportLogsServiceResponse> for Accepted {
    fn from(answer: ExportLogsServiceResponse) -> Accepted {
        answer
            .partial_success
            .map(|p| Accepted { rejected: p.rejected_log_records.max(0) as u64, message: p.error_message })
            .unwrap_or_default()
    }
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
    #[error("OTLP: {0}")]
    Ca(#[from] crate::ca_file::CaFileError),
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
                    tls = tls.root_certs(crate::ca_file::roots(path)?);
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

    /// Where it sends, without a password the URL may carry.
    pub fn url(&self) -> String {
        match self {
            Transport::Http { target, .. } | Transport::Grpc { target, .. } => target.shown_url(),
        }
    }

    pub async fn export(&self, request: Request) -> Result<Accepted, SendError> {
        match self {
            Transport::Http { agent, target } => {
                let (agent, target) = (agent.clone(), target.clone());
                tokio::task::spawn_blocking(move || post(&agent, &target, &request))
                    .await
                    .map_err(|e| SendError { retryable: true, reason: format!("export task failed: {e}") })?
            }
            Transport::Grpc { channel, target } => match request {
                Request::Metrics(r) => {
                    call::<_, ExportMetricsServiceResponse>(channel.clone(), target, r, GRPC_METRICS_EXPORT).await
                }
                Request::Logs(r) => {
                    call::<_, ExportLogsServiceResponse>(channel.clone(), target, r, GRPC_LOGS_EXPORT).await
                }
            },
        }
    }
}

fn post(agent: &ureq::Agent, target: &Target, request: &Request) -> Result<Accepted, SendError> {
    let body = match request {
        Request::Metrics(r) => r.encode_to_vec(),
        Request::Logs(r) => r.encode_to_vec(),
    };
    let mut http = agent.post(&target.url).header("content-type", "application/x-protobuf");
    for (key, value) in &target.headers {
        http = http.header(key, value);
    }
    let mut answer = http
        .send(&body)
        .map_err(|e| SendError { retryable: true, reason: format!("POST {}: {e}", target.shown_url()) })?;
    let status = answer.status().as_u16();
    let bytes = answer.body_mut().with_config().limit(1 << 20).read_to_vec().unwrap_or_default();
    if (200..300).contains(&status) {
        // An empty or unreadable answer is a whole success.
        return Ok(match request {
            Request::Metrics(_) => ExportMetricsServiceResponse::decode(bytes.as_slice()).map(Accepted::from),
            Request::Logs(_) => ExportLogsServiceResponse::decode(bytes.as_slice()).map(Accepted::from),
        }
        .unwrap_or_default());
    }
    // The receiver's reason is a google.rpc.Status: its message (field 2)
    // is what a person reads; the status alone says enough otherwise.
    let reason = format!("POST {} answered {status}{}", target.shown_url(), status_message(&bytes));
    Err(SendError { retryable: matches!(status, 429 | 502 | 503 | 504), reason })
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

async fn call<Req, Resp>(
    channel: tonic::transport::Channel,
    target: &Target,
    request: Req,
    path: &'static str,
) -> Result<Accepted, SendError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static + Into<Accepted>,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| SendError {
        retryable: true,
        reason: format!("{}: {}", target.shown_url(), sqlbee_vocabulary::error_chain(&e)),
    })?;
    let mut request = tonic::Request::new(request);
    for (key, value) in &target.headers {
        // Checked when the transport was made.
        if let (Ok(k), Ok(v)) = (key.parse::<tonic::metadata::MetadataKey<_>>(), value.parse()) {
            request.metadata_mut().insert(k, v);
        }
    }
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    match grpc.unary(request, PathAndQuery::from_static(path), codec).await {
        Ok(answer) => Ok(answer.into_inner().into()),
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
                    target.shown_url(),
                    status.code(),
                    status.message().chars().take(300).collect::<String>()
                ),
            })
        }
    }
}
