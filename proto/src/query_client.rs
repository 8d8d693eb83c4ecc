//! The Query service as its callers reach it: the query tools (`sqlbee
//! top` and the rest) import this and the wire types, nothing of the
//! collector. Owns what a caller must agree on with the service: the order
//! keys, the event kinds and how large an answer may be (the collector's
//! tests hold its own lists to these).
use sqlbee_figures::{RANK_KEYS, RANKED};
use tonic::{codec::CompressionEncoding, service::interceptor::InterceptedService, transport::Channel};

use crate::client::{self, BearerToken};
pub use crate::client::{ClientError, ClientOptions, read_token_file};
use crate::v1::{annotate_client::AnnotateClient, query_client::QueryClient};

/// The event kinds `Events` filters by: what the detection records, and
/// the changes agents saw run.
pub const EVENT_KINDS: [&str; 4] = ["regressed", "new", "plan_changed", CHANGE_EVENT_KIND];

/// The kind of the events the collector writes for what agents saw change
/// a server (`Event.change`).
pub const CHANGE_EVENT_KIND: &str = "change";

/// The `order_by` keys of what every digest has, before the figures'.
const TOTALS_KEYS: [&str; 6] = ["count", "errors", "total", "avg", "p99", "wait"];

/// The `order_by` keys `Top` accepts, in the order the top page shows its
/// columns: the totals', then each figure the figure list ranks by.
pub const ORDER_KEYS: [&str; TOTALS_KEYS.len() + RANKED] = {
    let mut keys = [""; TOTALS_KEYS.len() + RANKED];
    let mut i = 0;
    while i < keys.len() {
        keys[i] = if i < TOTALS_KEYS.len() { TOTALS_KEYS[i] } else { RANK_KEYS[i - TOTALS_KEYS.len()] };
        i += 1;
    }
    keys
};

/// Answers can be large (10 000 digests with samples).
pub const MAX_ANSWER: usize = 256 * 1024 * 1024;

pub type Client = QueryClient<InterceptedService<Channel, BearerToken>>;

/// Connects now (a wrong address or TLS setting is reported here), with
/// the bearer token on every call and gzip answers accepted.
pub async fn connect(opts: &ClientOptions) -> Result<Client, ClientError> {
    let token = BearerToken::new(opts.token.as_deref())?;
    let channel = client::connect(opts).await?;
    Ok(QueryClient::with_interceptor(channel, token)
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(MAX_ANSWER))
}

pub type Annotator = AnnotateClient<InterceptedService<Channel, BearerToken>>;

/// The Annotate service's client (`sqlbee annotate`), connected as
/// `connect` does; it takes a token of the `annotate` role.
pub async fn connect_annotate(opts: &ClientOptions) -> Result<Annotator, ClientError> {
    let token = BearerToken::new(opts.token.as_deref())?;
    let channel = client::connect(opts).await?;
    Ok(AnnotateClient::with_interceptor(channel, token))
}
