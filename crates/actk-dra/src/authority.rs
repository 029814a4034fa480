//! The registration socket's `:authority` fix.
//!
//! The kubelet's plugin watcher dials a registration socket with the socket's path as the gRPC
//! target (pkg/kubelet/pluginmanager/operationexecutor `dial`, still so in 1.34), so grpc-go
//! sends the path, percent-encoded, as the HTTP/2 `:authority`
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Factk.dev-reg.sock`). The h2 crate under tonic
//! rejects such an authority with RST_STREAM PROTOCOL_ERROR (hyperium/h2 pull request 487 is
//! still open), so a plain tonic server never answers GetInfo and the kubelet never registers
//! the driver. (The DRA socket itself is dialled as `unix:PATH`, whose authority is
//! `localhost`.)
//!
//! This module sits between the accepted unix connection and tonic: frames from the client are
//! read one by one (RFC 9113 section 4), and each header block (HEADERS plus CONTINUATION) is
//! decoded with HPACK (RFC 7541), its `:authority` replaced by `localhost` when it is not a
//! valid authority, and encoded again for the server; every other frame, and everything the
//! server sends, passes through unchanged. One decoder follows the client's dynamic table and
//! one encoder builds the server's, so indexed headers stay consistent on both sides.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixStream;

/// The HTTP/2 client connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Largest frame payload we forward (the default SETTINGS_MAX_FRAME_SIZE every peer accepts).
const MAX_FRAME: usize = 16_384;
/// Largest header block we accept from a client (the kubelet sends a few hundred bytes).
const MAX_BLOCK: usize = 64 * 1024;

/// The server side of one fixed connection, for tonic's `serve_with_incoming`.
pub struct Fixed(DuplexStream);

impl tonic::transport::server::Connected for Fixed {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Fixed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Fixed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Whether `value` is an authority the h2 crate accepts (`host[:port]`, no path, no `%`).
pub fn valid_authority(value: &[u8]) -> bool {
    !value.is_empty() && http::uri::Authority::try_from(value).is_ok()
}

/// Wraps accepted connection `conn`: returns the stream to hand to the server, and spawns the
/// tasks that copy between the two (ending when either side closes or a client sends what is
/// not HTTP/2; a bad header block closes the connection).
pub fn fix(conn: UnixStream) -> Fixed {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut client_r, mut client_w) = conn.into_split();
    let (mut server_r, mut server_w) = tokio::io::split(ours);
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_r, &mut client_w).await;
        let _ = client_w.shutdown().await;
    });
    tokio::spawn(async move {
        if let Err(e) = rewrite(&mut client_r, &mut server_w).await {
            tracing::debug!("registration connection closed: {e}");
        }
        let _ = server_w.shutdown().await;
    });
    Fixed(theirs)
}

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<([u8; 9], Vec<u8>)>> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((head, payload)))
}

fn frame_head(len: usize, kind: u8, flags: u8, stream: [u8; 4]) -> [u8; 9] {
    [(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags, stream[0], stream[1], stream[2], stream[3]]
}

/// The header block fragment of a HEADERS frame payload, without padding and priority fields.
fn headers_fragment(flags: u8, payload: &[u8]) -> std::io::Result<&[u8]> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = p.split_first().ok_or_else(|| bad("HEADERS frame too short for its pad length"))?;
        pad = usize::from(n);
        p = rest;
    }
    if flags & PRIORITY != 0 {
        p = p.get(5..).ok_or_else(|| bad("HEADERS frame too short for its priority fields"))?;
    }
    p.get(..p.len().checked_sub(pad).ok_or_else(|| bad("HEADERS padding longer than the frame"))?)
        .ok_or_else(|| bad("bad HEADERS padding"))
}

/// Copies client frames from `r` to `w`, fixing `:authority` in every header block.
pub async fn rewrite<R, W>(r: &mut R, w: &mut W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    r.read_exact(&mut preface).await?;
    w.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 prior knowledge: let the server answer it as it would.
        tokio::io::copy(r, w).await?;
        return Ok(());
    }
    let mut decoder = loona_hpack::Decoder::new();
    let mut encoder = loona_hpack::Encoder::new();
    while let Some((head, payload)) = read_frame(r).await? {
        if head[3] != HEADERS {
            w.write_all(&head).await?;
            w.write_all(&payload).await?;
            w.flush().await?;
            continue;
        }
        let flags = head[4];
        let stream = [head[5], head[6], head[7], head[8]];
        let mut block = headers_fragment(flags, &payload)?.to_vec();
        let mut end_headers = flags & END_HEADERS != 0;
        while !end_headers {
            let (h, p) = read_frame(r).await?.ok_or_else(|| bad("connection closed inside a header block"))?;
            if h[3] != CONTINUATION || h[5..9] != stream {
                return Err(bad("a header block was interrupted by another frame"));
            }
            block.extend_from_slice(&p);
            if block.len() > MAX_BLOCK {
                return Err(bad("header block larger than 64 KiB"));
            }
            end_headers = h[4] & END_HEADERS != 0;
        }
        let headers = decoder.decode(&block).map_err(|e| bad(format!("bad HPACK header block: {e:?}")))?;
        let fixed: Vec<(Vec<u8>, Vec<u8>)> = headers
            .into_iter()
            .map(|(n, v)| if n == b":authority" && !valid_authority(&v) { (n, b"localhost".to_vec()) } else { (n, v) })
            .collect();
        let out = encoder.encode(fixed.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut chunks = out.chunks(MAX_FRAME).peekable();
        let mut first = true;
        if out.is_empty() {
            w.write_all(&frame_head(0, HEADERS, END_HEADERS | (flags & END_STREAM), stream)).await?;
        }
        while let Some(c) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut f) = if first { (HEADERS, flags & END_STREAM) } else { (CONTINUATION, 0) };
            if last {
                f |= END_HEADERS;
            }
            w.write_all(&frame_head(c.len(), kind, f, stream)).await?;
            w.write_all(c).await?;
            first = false;
        }
        w.flush().await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert!(valid_authority(b"localhost"));
        assert!(valid_authority(b"127.0.0.1:10250"));
        assert!(!valid_authority(b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx.sock"));
        assert!(!valid_authority(b"/var/lib/kubelet/plugins_registry/x.sock"));
        assert!(!valid_authority(b""));
    }

    #[test]
    fn padded_and_priority_fragments() {
        assert_eq!(headers_fragment(0, b"abc").unwrap(), b"abc");
        assert_eq!(headers_fragment(PADDED, b"\x02abcXX").unwrap(), b"abc");
        assert_eq!(headers_fragment(PRIORITY, b"12345abc").unwrap(), b"abc");
        assert!(headers_fragment(PADDED, b"\x09abc").is_err());
        assert!(headers_fragment(PRIORITY, b"123").is_err());
    }
}
