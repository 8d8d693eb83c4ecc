//! The gRPC codec of every sqlbee.v1 service: prost messages, decoded from
//! one contiguous slice of the received frame.
//!
//! tonic hands a decoder its frame as a `DecodeBuf` over a `BytesMut`.
//! Decoding through that `Buf` goes through two levels of indirection and
//! a `BytesMut` advance for every varint, tag and length, which made
//! decoding a batch about a third of the collector's CPU. The frame is
//! contiguous, so prost can read it as `&[u8]`, whose reads are plain slice
//! arithmetic. The bytes on the wire are unchanged.
//!
//! Before prost decodes a message large enough to matter,
//! `bounds::check_if_large` walks its bytes and refuses one whose decoded
//! form would pass the message's limits: the count of a repeated field, the
//! length of a string, or the estimated decoded size. So no request makes
//! the collector allocate more than a stated bound, whatever its size on
//! the wire.
use std::marker::PhantomData;

use prost::{
    Message,
    bytes::{Buf, Bytes},
};
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder},
};
use tonic_prost::ProstEncoder;

use crate::bounds::{self, Bounded, OutOfBounds};

/// `application/grpc+proto`, as `tonic_prost::ProstCodec`: its encoder, and
/// the decoder below. The generated services name it (see build.rs).
pub struct SliceCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SliceCodec<T, U> {
    fn default() -> Self {
        SliceCodec(PhantomData)
    }
}

impl<T, U> Codec for SliceCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Bounded + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Message + Default + Bounded> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let len = buf.remaining();
        let refused =
            |e: OutOfBounds| Status::invalid_argument(format!("{} refused before decoding: {e}", U::SCHEMA.name));
        let decoded = if buf.chunk().len() == len {
            bounds::check_if_large::<U>(buf.chunk()).map_err(refused)?;
            let message = U::decode(buf.chunk());
            buf.advance(len);
            message
        } else {
            // Not seen with tonic's BytesMut frames; still correct if a
            // frame ever arrives in pieces.
            let frame: Bytes = buf.copy_to_bytes(len);
            bounds::check_if_large::<U>(frame.as_ref()).map_err(refused)?;
            U::decode(frame.as_ref())
        };
        // INTERNAL for a message that does not parse, as tonic's own codec
        // answers (the collector maps it to INVALID_ARGUMENT for pushes).
        decoded.map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}
