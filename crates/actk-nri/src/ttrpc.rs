//! ttrpc framing (containerd/ttrpc, `channel.go`): every message is a 10-byte header — payload
//! length (u32, big endian), stream id (u32 BE), message type (u8: 1 request, 2 response,
//! 3 data), flags (u8) — and a protobuf payload: a [`Request`] (service, method, payload,
//! timeout) or a [`Response`] (status, payload). A client numbers its streams 1, 3, 5, ...; a
//! response carries its request's stream id. Messages are at most 4 MiB.
//!
//! [`Decoder`] takes bytes in whatever pieces the transport delivers (NRI's multiplexer cuts a
//! byte stream into frames that need not align with messages) and yields whole messages. A
//! message longer than the limit is discarded as its bytes arrive and reported once
//! ([`FrameError::TooLong`]), and the stream goes on with the next message, as ttrpc's own
//! receiver does (ttrpc 1.2 `channel.recv`: discard, then a `ResourceExhausted` error for that
//! stream), so one oversized request costs one failed call, not the connection.

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
    /// A message over the size limit (ttrpc's answer to one).
    pub const RESOURCE_EXHAUSTED: i32 = 8;
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

/// A message that cannot be delivered. The [`Decoder`] stays usable: it discards the
/// message's bytes and goes on with the next message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A header announces more than [`MAX_PAYLOAD`] bytes: the payload is skipped.
    #[error("ttrpc message of {len} bytes on stream {stream} exceeds the 4 MiB limit")]
    TooLong {
        /// Stream id of the message.
        stream: u32,
        /// Its message type.
        kind: u8,
        /// Announced payload length in bytes.
        len: usize,
    },
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
    /// Bytes of an oversized message still to be discarded as they arrive.
    skip: usize,
}

impl Decoder {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        let dropped = self.skip.min(bytes.len());
        self.skip -= dropped;
        self.buf.extend_from_slice(&bytes[dropped..]);
    }

    /// The next whole frame, if the bytes so far hold one.
    ///
    /// Errors: [`FrameError::TooLong`] once for a message over the limit, whose payload is then
    /// discarded (also the part not received yet); call again for the messages after it.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_PAYLOAD {
            let stream = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
            let kind = self.buf[8];
            let here = (self.buf.len() - HEADER_LEN).min(len);
            self.buf.drain(..HEADER_LEN + here);
            self.skip = len - here;
            return Err(FrameError::TooLong { stream, kind, len });
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

    /// An oversized message is reported once with its stream, discarded however its bytes
    /// arrive, and the message after it is delivered whole (ttrpc's receiver does the same).
    #[test]
    fn an_oversized_message_is_skipped_and_the_next_one_delivered() {
        let big = MAX_PAYLOAD + 1;
        let mut wire = Vec::new();
        wire.extend_from_slice(&(big as u32).to_be_bytes());
        wire.extend_from_slice(&5u32.to_be_bytes());
        wire.extend_from_slice(&[TYPE_REQUEST, 0]);
        wire.extend(std::iter::repeat_n(0xab, big));
        let next = Frame::request(7, "s", "m", vec![1, 2], 0);
        wire.extend(next.encode());
        for cut in [7, 4096, 1 << 20, wire.len()] {
            let mut d = Decoder::default();
            let (mut errors, mut frames) = (Vec::new(), Vec::new());
            for piece in wire.chunks(cut) {
                d.push(piece);
                loop {
                    match d.next_frame() {
                        Ok(Some(f)) => frames.push(f),
                        Ok(None) => break,
                        Err(e) => errors.push(e),
                    }
                }
            }
            assert_eq!(errors, [FrameError::TooLong { stream: 5, kind: TYPE_REQUEST, len: big }], "pieces of {cut}");
            assert_eq!(frames, std::slice::from_ref(&next), "pieces of {cut}");
        }
        // A message of exactly the limit is delivered.
        let max = Frame { stream: 9, kind: TYPE_REQUEST, flags: 0, payload: vec![1; MAX_PAYLOAD] };
        let mut d = Decoder::default();
        d.push(&max.encode());
        assert_eq!(d.next_frame().unwrap().map(|f| f.payload.len()), Some(MAX_PAYLOAD));
    }
}
