//! Admission control in front of a service: at most `limit` of its
//! requests in flight at once, at most `per_address` from one client
//! address and at most `per_token` with one bearer token (the token check,
//! in front of this, names the caller). A request beyond any is answered RESOURCE_EXHAUSTED at once,
//! before its body is read or decoded, so a burst of large pushes cannot
//! make the collector hold more than `limit` messages (each at most
//! `server::MAX_MESSAGE` decoded) at a time, one host cannot take every
//! place, and queries, with a small limit of their own, cannot take every
//! thread from ingest. Agents retry RESOURCE_EXHAUSTED with backoff.
//!
//! An admitted request keeps its place until its store work has ended
//! (`store_task::holding`), and its body must keep arriving (`MinRate`):
//! a body that trickles, that stops, or that is not whole by a deadline is
//! cut with UNAVAILABLE, which an agent retries, so a slow sender cannot
//! hold places it does not use, whatever it sent first.
use std::{
    convert::Infallible,
    future::Future,
    net::IpAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Semaphore;
use tonic::{
    Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};

use super::{auth::Caller, places::Places, store_task::holding};

/// A request body gets this long before its rate is judged.
pub const BODY_GRACE: Duration = Duration::from_secs(10);
/// Past the grace, a body must have arrived at this rate on average.
pub const MIN_BODY_RATE: u64 = 64 * 1024;
/// No byte for this long ends a body, however much came before: a burst
/// then silence would otherwise hold its place for as long as the burst
/// had paid for at the minimum rate.
pub const BODY_STALL: Duration = Duration::from_secs(10);
/// A whole body must have arrived within this: a 32 MiB push at 300 KiB/s.
pub const BODY_DEADLINE: Duration = Duration::from_secs(120);

#[derive(Clone, Debug)]
pub struct Admit<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
    by_address: Places<IpAddr>,
    by_token: Places<u64>,
}

impl<S> Admit<S> {
    pub fn new(inner: S, limit: usize, per_address: usize, per_token: usize) -> Admit<S> {
        Admit {
            inner,
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            by_address: Places::new(per_address.clamp(1, limit)),
            by_token: Places::new(per_token.clamp(1, limit)),
        }
    }
}

impl<S: NamedService> NamedService for Admit<S> {
    const NAME: &'static str = S::NAME;
}

/// The client's address as tonic's listener recorded it.
fn peer<B>(request: &http::Request<B>) -> Option<IpAddr> {
    let extensions = request.extensions();
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|t| t.get_ref().remote_addr()))
        .map(|a| a.ip())
}

impl<S, B> Service<http::Request<B>> for Admit<S>
where
    S: Service<http::Request<MinRate<B>>, Response = http::Response<Body>, Error = Infallible> + NamedService,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let busy = |why: String| -> Self::Future {
            let status = Status::resource_exhausted(why);
            Box::pin(async move { Ok(status.into_http()) })
        };
        let place = match peer(&request) {
            Some(address) => match self.by_address.take(address) {
                Some(place) => Some(place),
                None => {
                    return busy(format!(
                        "{}: {} requests from {address} in flight already; retry later",
                        S::NAME,
                        self.by_address.limit()
                    ));
                }
            },
            None => None,
        };
        let token_place = match request.extensions().get::<Caller>() {
            Some(caller) => match self.by_token.take(caller.token) {
                Some(place) => Some(place),
                None => {
                    return busy(format!(
                        "{}: {} requests with this token in flight already; retry later",
                        S::NAME,
                        self.by_token.limit()
                    ));
                }
            },
            None => None,
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return busy(format!("{}: {} requests in flight already; retry later", S::NAME, self.limit));
        };
        let response = self.inner.call(request.map(MinRate::new));
        // Every place, the address's and the token's too, is given back
        // when the store work ends: a reader that gives up its requests
        // cannot start more store work than its places allow.
        Box::pin(holding((permit, place, token_place), response))
    }
}

/// A request body that must keep arriving: after `BODY_GRACE`, at least
/// `MIN_BODY_RATE` bytes a second on average, never `BODY_STALL` without
/// a byte, and whole within `BODY_DEADLINE`, or it ends with UNAVAILABLE.
pub struct MinRate<B> {
    inner: Pin<Box<B>>,
    started: Instant,
    received: u64,
    /// When the last bytes came (the start, before any).
    last_data: Instant,
    check: Pin<Box<tokio::time::Sleep>>,
}

impl<B> MinRate<B> {
    fn new(inner: B) -> MinRate<B> {
        let started = Instant::now();
        MinRate {
            inner: Box::pin(inner),
            started,
            received: 0,
            last_data: started,
            check: Box::pin(tokio::time::sleep_until((started + BODY_GRACE).into())),
        }
    }

    /// When the body stops being acceptable, and why: the bytes received
    /// so far stop being enough, it has been silent too long, or it is past
    /// its deadline; the earliest of the three.
    fn due(&self) -> (Instant, &'static str) {
        let rate = self.started + BODY_GRACE + Duration::from_secs_f64(self.received as f64 / MIN_BODY_RATE as f64);
        [
            (rate, "arrived too slowly"),
            (self.last_data + BODY_STALL.max(BODY_GRACE), "stopped arriving"),
            (self.started + BODY_DEADLINE, "was not whole in time"),
        ]
        .into_iter()
        .min_by_key(|(at, _)| *at)
        .expect("three deadlines")
    }
}

impl<B> HttpBody for MinRate<B>
where
    B: HttpBody,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        match self.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let bytes = hyper::body::Buf::remaining(data) as u64;
                    if bytes > 0 {
                        self.received += bytes;
                        self.last_data = Instant::now();
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let (due, why) = self.due();
                if Instant::now() >= due {
                    let elapsed = self.started.elapsed().as_secs();
                    let received = self.received;
                    let silent = self.last_data.elapsed().as_secs();
                    tracing::debug!(received, elapsed, silent, why, "cut a request body");
                    return Poll::Ready(Some(Err(Box::new(Status::unavailable(format!(
                        "the request body {why} ({received} bytes in {elapsed} s, the last {silent} s ago; at least \
                         {} KiB/s after {} s, no pause of {} s, whole within {} s); retry",
                        MIN_BODY_RATE / 1024,
                        BODY_GRACE.as_secs(),
                        BODY_STALL.as_secs(),
                        BODY_DEADLINE.as_secs()
                    ))))));
                }
                self.check.as_mut().reset(due.into());
                // Registers the wakeup; it fires at `due` at the latest.
                let _ = self.check.as_mut().poll(cx);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
