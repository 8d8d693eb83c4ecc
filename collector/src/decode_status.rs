//! Gives undecodable requests the status they deserve. tonic answers a
//! request it cannot decode with INTERNAL (bad protobuf, including invalid
//! UTF-8 in a `string` field, an empty body, broken gzip), OUT_OF_RANGE
//! (message above the size limit) or RESOURCE_EXHAUSTED (gzip expanding
//! past the limit). For an agent INTERNAL reads as "collector bug, retry"
//! and RESOURCE_EXHAUSTED as "busy, retry later", yet such a request fails
//! identically forever. This wrapper rewrites exactly those answers to
//! INVALID_ARGUMENT, keeping tonic's text, which names the field
//! ("DigestStats.sample: InstanceWindow.digests: Batch.windows: invalid
//! string value: data is not UTF-8 encoded"). Everything else passes
//! through untouched.
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tonic::{
    Code, Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
};

#[derive(Clone, Debug)]
pub struct DecodeErrorsAsInvalid<S>(pub S);

impl<S: NamedService> NamedService for DecodeErrorsAsInvalid<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for DecodeErrorsAsInvalid<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let response = self.0.call(request);
        Box::pin(async move { Ok(rewrite(response.await?)) })
    }
}

/// A decode failure is answered before any handler runs, as a headers-only
/// response carrying grpc-status; a handler's own answers never match.
fn rewrite(response: http::Response<Body>) -> http::Response<Body> {
    match Status::from_header_map(response.headers()).and_then(|s| reclassify(&s)) {
        Some(status) => status.into_http(),
        None => response,
    }
}

fn reclassify(status: &Status) -> Option<Status> {
    let m = status.message();
    let undecodable = match status.code() {
        Code::Internal => {
            m.starts_with("failed to decode Protobuf message")
                || m.starts_with("Missing request message")
                || m.starts_with("Error decompressing")
                || m.starts_with("protocol error: received message with")
        }
        Code::OutOfRange => m.starts_with("Error, decoded message length too large"),
        Code::ResourceExhausted => m.starts_with("Error decompressing: size limit"),
        _ => false,
    };
    undecodable.then(|| Status::invalid_argument(format!("request cannot be decoded and will never be accepted: {m}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_decode_failures_change() {
        let decode = Status::internal("failed to decode Protobuf message: Batch.windows: invalid string value");
        assert_eq!(reclassify(&decode).unwrap().code(), Code::InvalidArgument);
        assert!(reclassify(&decode).unwrap().message().contains("Batch.windows"));
        let big =
            Status::out_of_range("Error, decoded message length too large: found 40 bytes, the limit is: 32 bytes");
        assert_eq!(reclassify(&big).unwrap().code(), Code::InvalidArgument);
        let bomb = Status::resource_exhausted("Error decompressing: size limit, of 32 bytes, exceeded");
        assert_eq!(reclassify(&bomb).unwrap().code(), Code::InvalidArgument);
        assert!(reclassify(&Status::internal("store failed")).is_none());
        assert!(reclassify(&Status::resource_exhausted("store full")).is_none());
        assert!(reclassify(&Status::unavailable("failed to decode Protobuf message")).is_none());
    }
}
