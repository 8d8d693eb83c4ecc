//! Admission control in front of a service: at most `limit` of its
//! requests in flight at once. A request beyond that is answered
//! RESOURCE_EXHAUSTED at once, before its body is read or decoded, so a
//! burst of large pushes cannot make the collector hold more than `limit`
//! messages (each at most `server::MAX_MESSAGE` decoded) at a time, and
//! queries, with a small limit of their own, cannot take every thread from
//! ingest. Agents retry RESOURCE_EXHAUSTED with backoff.
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::sync::Semaphore;
use tonic::{
    Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
};

#[derive(Clone, Debug)]
pub struct Admit<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
}

impl<S> Admit<S> {
    pub fn new(inner: S, limit: usize) -> Admit<S> {
        Admit { inner, permits: Arc::new(Semaphore::new(limit)), limit }
    }
}

impl<S: NamedService> NamedService for Admit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Admit<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible> + NamedService,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let status = Status::resource_exhausted(format!(
                "{}: {} requests in flight already; retry later",
                S::NAME,
                self.limit
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            drop(permit);
            response
        })
    }
}
