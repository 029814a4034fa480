//! ttrpc framing (containerd/ttrpc, `channel.go`): every message is a 10-byte header — payload
//! length (u32, big endian), stream id (u32 BE), message type (u8: 1 request, 2 response,
//! 3 data), flags (u8) — and a protobuf payload: a [`Request`] (service, method, payload,
//! timeout) or a [`Response`] (status, payload). A client numbers its streams 1, 3, 5, ...; a
//! response carries its request's stream id. Messages are at most 4 MiB.
//!
//! [`Decoder`] takes bytes in whatever pieces the transport delivers (NRI's multiplexer cuts a
//! byte stream into frames that need not align with messages) and yields whole messages.

use prost::Message;

pub use crate::proto::ttrpc::{Request, Response, Status};

/// Header length in bytes.
pub const HEADER_LEN: usize = 10;
/// Largest payload ttrpc accepts (4 MiB).
pub const MAX_PAYLOAD: usize = 4 << 20;
/// Message type of a request.
pub const TYPE_REQUEST: u8 = 1;
/// Message type of a response.
pub const TYPE_RESPONSE: u8 = 2;

/// gRPC status codes used in responses (google.rpc.Code).
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// The request is wrong (a container's request actk cannot serve).
    pub const INVALID_ARGUMENT: i32 = 3;
    /// A method this plugin does not serve.
    pub const UNIMPLEMENTED: i32 = 12;
    /// A failure inside the plugin.
    pub const INTERNAL: i32 = 13;
}

/// One ttrpc message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Stream id (odd: opened by the client).
    pub stream: u32,
    /// [`TYPE_REQUEST`], [`TYPE_RESPONSE`] or 3 (data).
    pub kind: u8,
    /// Type-specific flags.
    pub flags: u8,
    /// The protobuf payload.
    pub payload: Vec<u8>,
}

/// A malformed byte stream: the connection cannot be used any more.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// A header announces more than [`MAX_PAYLOAD`] bytes.
    #[error("ttrpc message of {0} bytes exceeds the 4 MiB limit")]
    TooLong(usize),
}

impl Frame {
    /// Header and payload as they go on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.payload);
        out
    }

    /// A response frame for `stream` with `status` and `payload` (encoded [`Response`]).
    pub fn response(stream: u32, status: Status, payload: Vec<u8>) -> Frame {
        let r = Response { status: Some(status), payload };
        Frame { stream, kind: TYPE_RESPONSE, flags: 0, payload: r.encode_to_vec() }
    }

    /// A request frame for `stream` calling `service`/`method` with `payload`.
    pub fn request(stream: u32, service: &str, method: &str, payload: Vec<u8>, timeout_nano: i64) -> Frame {
        let r = Request { service: service.into(), method: method.into(), payload, timeout_nano, metadata: Vec::new() };
        Frame { stream, kind: TYPE_REQUEST, flags: 0, payload: r.encode_to_vec() }
    }
}

/// Reassembles frames from a byte stream delivered in arbitrary pieces.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if the bytes so far hold one. Errors: a length over the limit.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLong(len));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let stream = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
        let (kind, flags) = (self.buf[8], self.buf[9]);
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Frame { stream, kind, flags, payload }))
    }
}

/// An OK status.
pub fn ok() -> Status {
    Status { code: code::OK, message: String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_split_of_the_byte_stream() {
        let a = Frame::request(1, "nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", vec![1, 2, 3], 0);
        let b = Frame::response(1, ok(), vec![9; 5000]);
        let wire: Vec<u8> = [a.encode(), b.encode()].concat();
        for cut in [1, 3, 10, 11, 57, wire.len() - 1] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, vec![a.clone(), b.clone()], "pieces of {cut} bytes");
        }
        let req = Request::decode(a.payload.as_slice()).unwrap();
        assert_eq!((req.service.as_str(), req.method.as_str()), ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin"));
    }

    #[test]
    fn oversized_length_is_an_error() {
        let mut d = Decoder::default();
        d.push(&[0x01, 0, 0, 0, 0, 0, 0, 1, 1, 0]);
        assert!(matches!(d.next_frame(), Err(FrameError::TooLong(16_777_216))));
    }
}
