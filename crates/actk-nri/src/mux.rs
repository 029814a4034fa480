//! NRI's connection multiplexer (containerd/nri `pkg/net/multiplex`): one unix socket carries
//! several logical connections. Each frame on the socket is an 8-byte header — connection id
//! (u32, big endian) and payload length (u32 BE) — and that many bytes of the logical
//! connection's byte stream. Id 0 is reserved; NRI uses id 1 for the plugin's service (the
//! runtime is the ttrpc client there) and id 2 for the runtime's service (the plugin is the
//! client: `RegisterPlugin`). A frame's payload is at most a ttrpc header plus 4 MiB; this side
//! writes frames of at most 4 KiB ([`WRITE_CHUNK`]). Frames of an id nobody opened are dropped.

/// Frame header length in bytes.
pub const HEADER_LEN: usize = 8;
/// Logical connection on which the plugin serves the `Plugin` service.
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Logical connection on which the plugin calls the runtime's `Runtime` service.
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Largest payload of one frame (ttrpc header + 4 MiB, as NRI's multiplexer writes them).
pub const MAX_FRAME_PAYLOAD: usize = crate::ttrpc::HEADER_LEN + crate::ttrpc::MAX_PAYLOAD;

/// Largest frame this side writes. NRI's Go multiplexer hands each frame whole to one `Read`
/// and fails it with ENOMEM when the reader's buffer is smaller; its ttrpc reads through a
/// 4 KiB `bufio.Reader` (or straight into the rest of the message being read). Frames of at
/// most 4 KiB that never span two ttrpc messages fit every such read; bigger ones made
/// containerd 2.1 drop the plugin on its first sizeable CreateContainer answer.
pub const WRITE_CHUNK: usize = 4096;

/// One whole message (`bytes`, a ttrpc frame) of logical connection `conn` as multiplexer
/// frames for the socket, split at [`WRITE_CHUNK`]. Call it once per message.
pub fn encode(conn: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + HEADER_LEN * (1 + bytes.len() / WRITE_CHUNK));
    for chunk in bytes.chunks(WRITE_CHUNK) {
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// A frame header that cannot be right: the socket must be closed.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// A frame longer than [`MAX_FRAME_PAYLOAD`].
    #[error("NRI multiplexer frame of {len} bytes on connection {conn} exceeds {MAX_FRAME_PAYLOAD}")]
    TooLong {
        /// Logical connection id.
        conn: u32,
        /// Announced length.
        len: usize,
    },
}

/// Splits the socket's byte stream into (connection id, payload) frames.
#[derive(Debug, Default)]
pub struct Demux {
    buf: Vec<u8>,
}

impl Demux {
    /// Appends bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if any.
    pub fn next_frame(&mut self) -> Result<Option<(u32, Vec<u8>)>, MuxError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let conn = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return Err(MuxError::TooLong { conn, len });
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some((conn, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_of_two_connections_interleave_and_split() {
        let wire =
            [encode(PLUGIN_SERVICE_CONN, b"hello"), encode(RUNTIME_SERVICE_CONN, b"r"), encode(1, b"x")].concat();
        assert!(encode(1, b"").is_empty(), "nothing to send, no frame");
        let mut d = Demux::default();
        let mut got = Vec::new();
        for b in wire.chunks(3) {
            d.push(b);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, vec![(1, b"hello".to_vec()), (2, b"r".to_vec()), (1, b"x".to_vec())]);
        let big = vec![7u8; 2 * WRITE_CHUNK + 5];
        let enc = encode(1, &big);
        assert_eq!(enc.len(), big.len() + 3 * HEADER_LEN, "frames of at most 4 KiB");
        let mut d = Demux::default();
        d.push(&enc);
        let sizes: Vec<usize> = std::iter::from_fn(|| d.next_frame().unwrap()).map(|(_, b)| b.len()).collect();
        assert_eq!(sizes, [WRITE_CHUNK, WRITE_CHUNK, 5]);
        let mut d = Demux::default();
        d.push(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err());
    }
}
