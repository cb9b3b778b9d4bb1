//! The WebSocket under kubectl's SPDY tunnel (`SPDY/3.1+portforward.k8s.io`, kubectl ≥ 1.31's
//! port-forward), framed here rather than by tungstenite, for the pull direction's cost: a SPDY
//! data frame goes out as one WebSocket frame whose header, SPDY head and payload leave in one
//! vectored write, with no copy of the payload (tungstenite copies every payload into its write
//! buffer: a quarter of the node agent's CPU in a port-forward pull).
//!
//! Only what the tunnel needs of RFC 6455 on the server side: the handshake's accept key;
//! unmasked frames out (binary, pong, close); masked client frames in — binary and continuation
//! payloads are the tunnel's byte stream (their boundaries mean nothing), text is skipped, a
//! ping is answered, a close is answered and ends the stream; anything malformed ends it too.
//! No extensions are negotiated, so none is accepted.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, Mutex};

use super::spdy;
use super::zerocopy::{self, Pipe, Wire};

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;
/// The largest client frame taken: kubectl's are its reads of the local connection (32 KiB).
const MAX_FRAME: u64 = 16 << 20;

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut h = sha1::Sha1::new();
    h.update(key.trim().as_bytes());
    h.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// A server frame's header (FIN set, unmasked) for a payload of `len` bytes.
pub fn header(opcode: u8, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = 0x80 | opcode;
    if len < 126 {
        h[1] = len as u8;
        (h, 2)
    } else if len <= 0xffff {
        h[1] = 126;
        h[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        (h, 4)
    } else {
        h[1] = 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (h, 10)
    }
}

/// The writing half, shared by the sink (SPDY frames) and the source (pongs, a close's answer).
struct Writer<W> {
    io: W,
    closed: bool,
}

impl<W: Wire> Writer<W> {
    async fn frame(&mut self, opcode: u8, parts: &[&[u8]]) -> bool {
        if self.closed {
            return false;
        }
        let len = parts.iter().map(|p| p.len()).sum();
        let (h, n) = header(opcode, len);
        let mut all = vec![&h[..n]];
        all.extend_from_slice(parts);
        self.io.write_parts(&all).await
    }

    /// A binary frame of `head` and the `len` bytes `pipe` holds.
    async fn frame_spliced(&mut self, head: &[u8], pipe: &Pipe, len: usize) -> bool {
        if self.closed {
            return false;
        }
        let (h, n) = header(OP_BINARY, head.len() + len);
        self.io.write_spliced(&[&h[..n], head], pipe, len).await
    }

    /// A close frame (once) and the end of the connection's write side.
    async fn close(&mut self, code: u16) {
        if !self.closed {
            let _ = self.frame(OP_CLOSE, &[&code.to_be_bytes()]).await;
            self.closed = true;
            self.io.shutdown().await;
        }
    }
}

/// SPDY frames out: each one WebSocket binary frame.
pub struct Sink<W> {
    writer: Arc<Mutex<Writer<W>>>,
    splices: bool,
}

impl<W: Wire> spdy::FrameSink for Sink<W> {
    async fn send(&mut self, head: &[u8], body: &[u8]) -> bool {
        self.writer.lock().await.frame(OP_BINARY, &[head, body]).await
    }

    async fn send_spliced(&mut self, head: &[u8], pipe: &Pipe, len: usize) -> bool {
        self.writer.lock().await.frame_spliced(head, pipe, len).await
    }

    fn splices(&self) -> bool {
        self.splices
    }

    async fn finish(self) {
        self.writer.lock().await.close(1000).await;
    }
}

/// The client's binary payloads in, as one byte stream.
pub struct Source<R, W> {
    io: R,
    writer: Arc<Mutex<Writer<W>>>,
    pending: BytesMut,
    /// Within a text message (its continuations are skipped too).
    in_text: bool,
}

impl<R: AsyncRead + Unpin, W: Wire> Source<R, W> {
    /// At least `n` bytes pending; false at the end of the connection.
    async fn want(&mut self, n: usize) -> bool {
        while self.pending.len() < n {
            self.pending.reserve(n.max(16 << 10));
            match self.io.read_buf(&mut self.pending).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    }

    /// The next frame: its opcode and unmasked payload appended to `out` (binary and
    /// continuation of binary) or returned (control frames). None: the stream ends.
    async fn next_frame(&mut self, out: &mut BytesMut) -> Option<(u8, Vec<u8>)> {
        if !self.want(2).await {
            return None;
        }
        let (b0, b1) = (self.pending[0], self.pending[1]);
        let (fin, opcode, masked) = (b0 & 0x80 != 0, b0 & 0x0f, b1 & 0x80 != 0);
        // No extension was negotiated, and a client must mask (RFC 6455 §5.1, §5.2).
        if b0 & 0x70 != 0 || !masked {
            self.writer.lock().await.close(1002).await;
            return None;
        }
        let (len, at) = match b1 & 0x7f {
            126 => {
                if !self.want(4).await {
                    return None;
                }
                (u64::from(u16::from_be_bytes([self.pending[2], self.pending[3]])), 4)
            }
            127 => {
                if !self.want(10).await {
                    return None;
                }
                (u64::from_be_bytes(self.pending[2..10].try_into().expect("8 bytes")), 10)
            }
            n => (u64::from(n), 2),
        };
        let control = opcode >= 0x8;
        if len > MAX_FRAME || (control && (len > 125 || !fin)) {
            self.writer.lock().await.close(if control { 1002 } else { 1009 }).await;
            return None;
        }
        let len = len as usize;
        if !self.want(at + 4 + len).await {
            return None;
        }
        let mask: [u8; 4] = self.pending[at..at + 4].try_into().expect("4 bytes");
        self.pending.advance(at + 4);
        let payload = self.pending.split_to(len);
        let unmask = |dst: &mut Vec<u8>| dst.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        let data_of_binary = opcode == OP_BINARY || (opcode == OP_CONTINUATION && !self.in_text);
        match opcode {
            OP_TEXT => self.in_text = !fin,
            OP_CONTINUATION if self.in_text => self.in_text = !fin,
            _ => {}
        }
        if data_of_binary {
            let start = out.len();
            out.extend_from_slice(&payload);
            for (i, b) in out[start..].iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
            return Some((OP_BINARY, vec![]));
        }
        let mut body = vec![];
        if control {
            unmask(&mut body);
        }
        Some((opcode, body))
    }
}

impl<R, W> spdy::ByteSource for Source<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: Wire,
{
    async fn fill(&mut self, buf: &mut BytesMut) -> bool {
        loop {
            let before = buf.len();
            match self.next_frame(buf).await {
                None => return false,
                Some((OP_BINARY, _)) if buf.len() > before => return true,
                Some((OP_PING, body)) => {
                    if !self.writer.lock().await.frame(OP_PONG, &[&body]).await {
                        return false;
                    }
                }
                Some((OP_CLOSE, body)) => {
                    // Answered with the code it gave (none: a normal closure).
                    let code = body.get(..2).map_or(1000, |c| u16::from_be_bytes([c[0], c[1]]));
                    self.writer.lock().await.close(code).await;
                    return false;
                }
                // Pongs, text, empty binary frames: nothing for the stream.
                Some(_) => {}
            }
        }
    }
}

/// A SPDY session over the WebSocket on `io` (after the handshake's 101).
pub fn serve<IO>(io: IO) -> (spdy::Session, mpsc::Receiver<spdy::Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    serve_split(rd, zerocopy::Stream(wr))
}

/// [`serve`] over a connection's read side and a [`Wire`] of its write side.
pub fn serve_split<R, W>(rd: R, wr: W) -> (spdy::Session, mpsc::Receiver<spdy::Stream>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: Wire,
{
    let splices = wr.splices();
    let writer = Arc::new(Mutex::new(Writer { io: wr, closed: false }));
    let source = Source { io: rd, writer: writer.clone(), pending: BytesMut::new(), in_text: false };
    spdy::serve_on(source, Sink { writer, splices })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spdy::{ByteSource, FrameSink};
    use tokio::io::AsyncWriteExt;

    /// A client frame: masked, as a client sends it.
    fn client_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xffff => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    #[test]
    fn the_accept_key_is_rfc_6455s() {
        // RFC 6455 §1.3's example.
        assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn headers_use_the_shortest_length_form() {
        assert_eq!(header(OP_BINARY, 5), ([0x82, 5, 0, 0, 0, 0, 0, 0, 0, 0], 2));
        let (h, n) = header(OP_BINARY, 300);
        assert_eq!(&h[..n], [0x82, 126, 1, 44]);
        let (h, n) = header(OP_BINARY, 70_000);
        assert_eq!(&h[..n], [0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
    }

    /// Client frames in: binary and its continuations are the stream (text skipped), a ping is
    /// answered with a pong of its payload, a close is answered and ends the stream; out, a
    /// SPDY frame is one binary frame of head and body.
    #[tokio::test]
    async fn frames_in_and_out() {
        let (server, mut client) = tokio::io::duplex(1 << 20);
        let (rd, wr) = tokio::io::split(server);
        let writer = Arc::new(Mutex::new(Writer { io: zerocopy::Stream(wr), closed: false }));
        let mut source = Source { io: rd, writer: writer.clone(), pending: BytesMut::new(), in_text: false };
        let mut sink = Sink { writer, splices: false };

        let big = vec![7u8; 70_000];
        let mut input = client_frame(false, OP_BINARY, b"hel");
        input.extend(client_frame(true, OP_PING, b"are you there"));
        input.extend(client_frame(true, OP_CONTINUATION, b"lo"));
        input.extend(client_frame(false, OP_TEXT, b"skip"));
        input.extend(client_frame(true, OP_CONTINUATION, b"this"));
        input.extend(client_frame(true, OP_BINARY, &big));
        input.extend(client_frame(true, OP_CLOSE, &1001u16.to_be_bytes()));
        client.write_all(&input).await.unwrap();

        let mut stream = BytesMut::new();
        while source.fill(&mut stream).await {}
        let mut want = b"hello".to_vec();
        want.extend(&big);
        assert_eq!(&stream[..], &want[..]);

        // The pong and the close's answer went out; after the close nothing more does.
        assert!(!sink.send(b"head", b"body").await);
        let mut out = vec![];
        client.read_to_end(&mut out).await.unwrap();
        let mut pong = vec![0x8A, 13];
        pong.extend_from_slice(b"are you there");
        assert_eq!(&out[..15], &pong[..]);
        assert_eq!(&out[15..], [0x88, 2, 0x03, 0xE9]);
    }

    #[tokio::test]
    async fn a_spdy_frame_is_one_binary_frame_and_finish_closes() {
        let (server, mut client) = tokio::io::duplex(1 << 20);
        let (_rd, wr) = tokio::io::split(server);
        let mut sink =
            Sink { writer: Arc::new(Mutex::new(Writer { io: zerocopy::Stream(wr), closed: false })), splices: false };
        let body = vec![1u8; 200];
        assert!(sink.send(&[0, 0, 0, 1, 0, 0, 0, 200], &body).await);
        // A payload waiting in a pipe makes the same frame.
        let pipe = Pipe::new().unwrap();
        assert_eq!(pipe.put(&body).unwrap(), 200);
        assert!(sink.send_spliced(&[0, 0, 0, 1, 0, 0, 0, 200], &pipe, 200).await);
        sink.finish().await;
        let mut out = vec![];
        client.read_to_end(&mut out).await.unwrap();
        for at in [0, 212] {
            assert_eq!(&out[at..at + 4], [0x82, 126, 0, 208]);
            assert_eq!(&out[at + 4..at + 12], [0, 0, 0, 1, 0, 0, 0, 200]);
            assert_eq!(&out[at + 12..at + 212], &body[..]);
        }
        assert_eq!(&out[424..], [0x88, 2, 0x03, 0xE8]);
    }

    #[tokio::test]
    async fn unmasked_or_oversized_frames_end_the_stream_with_a_close() {
        for (bad, code) in [
            (vec![0x82, 0x03, b'a', b'b', b'c'], 1002u16),
            (vec![0x82, 0x80 | 127, 0, 0, 0, 0, 0x10, 0, 0, 0, 1, 2, 3, 4], 1009),
            (client_frame(false, OP_PING, b"x"), 1002),
        ] {
            let (server, mut client) = tokio::io::duplex(1 << 16);
            let (rd, wr) = tokio::io::split(server);
            let writer = Arc::new(Mutex::new(Writer { io: zerocopy::Stream(wr), closed: false }));
            let mut source = Source { io: rd, writer, pending: BytesMut::new(), in_text: false };
            client.write_all(&bad).await.unwrap();
            assert!(!source.fill(&mut BytesMut::new()).await, "{bad:?}");
            drop(source);
            let mut out = vec![];
            client.read_to_end(&mut out).await.unwrap();
            assert_eq!(out, [0x88, 2, (code >> 8) as u8, code as u8], "{bad:?}");
        }
    }
}
