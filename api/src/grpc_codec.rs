//! The gRPC codec of podpath's services: prost, except that a message that does not decode is
//! the caller's fault (`INVALID_ARGUMENT`), not the server's (`INTERNAL`, tonic-prost's choice).

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

#[derive(Debug, Clone)]
pub struct ProstCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ProstCodec<T, U> {
    fn default() -> Self {
        ProstCodec(PhantomData)
    }
}

impl<T, U> Codec for ProstCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ArgumentDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ArgumentDecoder(ProstDecoder::default())
    }
}

/// prost's decoder with its decode errors reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct ArgumentDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for ArgumentDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| Status::invalid_argument(format!("malformed message: {}", s.message())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
