//! SPDY/3.1, the part a server needs for Kubernetes' streaming protocols (kubelet's side of
//! `kubectl exec`, `attach`, `cp` and `port-forward` when they fall back from WebSockets, and
//! the SPDY that kubectl ≥ 1.31 tunnels inside a WebSocket for port-forward).
//!
//! Written here because no maintained Rust crate serves SPDY (see CONVENTIONS.md). Framing and
//! header blocks are pure functions ([`parse`], [`HeaderCodec`]); [`serve`] runs a session over
//! any byte stream. Flow control is not enforced in either direction, as in the Go library
//! (spdystream) that kubectl and kubelet use: WINDOW_UPDATE frames are read and ignored.

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::zerocopy::{self, Pipe, Wire};

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;
/// Frames above this are refused (SPDY allows 16 MiB; peers send far less).
const MAX_FRAME: usize = 1 << 24;
/// A header block that inflates beyond this is refused.
const MAX_HEADER_BYTES: usize = 256 << 10;
/// Outgoing data is cut into frames of at most this many bytes.
pub const MAX_DATA_FRAME: usize = 1 << 20;

/// A protocol error; the session ends with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("SPDY: {0}")]
pub struct SpdyError(pub String);

/// The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00, 2.6.10.1): length
/// prefixed header names and values, then a run of common strings.
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505\
            203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request\
            401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented\
            503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 \
            Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,\
            application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=\
            gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// One frame as read from the wire; header blocks are still compressed (they share the
/// session's zlib stream, see [`HeaderCodec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream: u32,
        fin: bool,
        block: Bytes,
    },
    SynReply {
        stream: u32,
        fin: bool,
        block: Bytes,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Ping(u32),
    GoAway,
    /// SETTINGS, WINDOW_UPDATE, HEADERS and unknown types: nothing this server acts on.
    Other(u16),
}

fn be32(b: &[u8], at: usize) -> Result<u32, SpdyError> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| SpdyError(format!("frame too short ({} bytes)", b.len())))
}

/// Splits the first frame off `buf`; `None` while it is incomplete. Pure.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize;
    if len > MAX_FRAME {
        return Err(SpdyError(format!("a frame of {len} bytes is over the limit")));
    }
    if buf.len() < 8 + len {
        return Ok(None);
    }
    let head = buf.split_to(8);
    let body = buf.split_to(len).freeze();
    let fin = head[4] & FLAG_FIN != 0;
    if head[0] & 0x80 == 0 {
        let stream = be32(&head, 0)? & 0x7fff_ffff;
        return Ok(Some(Frame::Data { stream, fin, data: body }));
    }
    let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
    if version != 3 {
        return Err(SpdyError(format!("version {version} is not supported (3 is)")));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    let stream = || be32(&body, 0).map(|s| s & 0x7fff_ffff);
    Ok(Some(match kind {
        SYN_STREAM if body.len() >= 10 => Frame::SynStream { stream: stream()?, fin, block: body.slice(10..) },
        SYN_REPLY if body.len() >= 4 => Frame::SynReply { stream: stream()?, fin, block: body.slice(4..) },
        RST_STREAM => Frame::RstStream { stream: stream()?, status: be32(&body, 4)? },
        PING => Frame::Ping(be32(&body, 0)?),
        GOAWAY => Frame::GoAway,
        SYN_STREAM | SYN_REPLY => return Err(SpdyError(format!("control frame {kind} is too short"))),
        other => Frame::Other(other),
    }))
}

fn control(kind: u16, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + body.len());
    f.extend_from_slice(&[0x80, 0x03]);
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(body);
    f
}

/// The 8 bytes in front of a data frame's payload of `len` bytes. Pure.
pub fn data_head(stream: u32, fin: bool, len: usize) -> [u8; 8] {
    let s = (stream & 0x7fff_ffff).to_be_bytes();
    let l = (len as u32).to_be_bytes();
    [s[0], s[1], s[2], s[3], if fin { FLAG_FIN } else { 0 }, l[1], l[2], l[3]]
}

/// A data frame. Pure.
pub fn data_frame(stream: u32, fin: bool, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + data.len());
    f.extend_from_slice(&data_head(stream, fin, data.len()));
    f.extend_from_slice(data);
    f
}

/// A SYN_REPLY frame around an encoded header block. Pure.
pub fn syn_reply(stream: u32, fin: bool, block: &[u8]) -> Vec<u8> {
    let mut body = stream.to_be_bytes().to_vec();
    body.extend_from_slice(block);
    control(SYN_REPLY, if fin { FLAG_FIN } else { 0 }, &body)
}

/// A SYN_STREAM frame (what a client sends; the tests play the client). Pure.
pub fn syn_stream(stream: u32, fin: bool, block: &[u8]) -> Vec<u8> {
    let mut body = stream.to_be_bytes().to_vec();
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    body.extend_from_slice(block);
    control(SYN_STREAM, if fin { FLAG_FIN } else { 0 }, &body)
}

pub fn ping(id: u32) -> Vec<u8> {
    control(PING, 0, &id.to_be_bytes())
}

pub fn rst_stream(stream: u32, status: u32) -> Vec<u8> {
    let mut body = stream.to_be_bytes().to_vec();
    body.extend_from_slice(&status.to_be_bytes());
    control(RST_STREAM, 0, &body)
}

pub fn goaway(last: u32) -> Vec<u8> {
    let mut body = last.to_be_bytes().to_vec();
    body.extend_from_slice(&0u32.to_be_bytes());
    control(GOAWAY, 0, &body)
}

/// Header blocks of one direction each: SPDY compresses every block of a session in one zlib
/// stream with the preset [`dictionary`], flushed (SYNC) at the end of each block.
pub struct HeaderCodec {
    inflate: Decompress,
    deflate: Compress,
}

impl Default for HeaderCodec {
    fn default() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate.set_dictionary(dictionary()).expect("a fresh deflate stream takes a dictionary");
        HeaderCodec { inflate: Decompress::new(true), deflate }
    }
}

impl HeaderCodec {
    /// Inflates and parses one header block (names lower-case; NUL-separated values split).
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
        let mut out: Vec<u8> = Vec::with_capacity(block.len() * 4 + 256);
        let mut input = block;
        loop {
            if out.capacity() - out.len() < 256 {
                out.reserve(4096);
            }
            if out.len() > MAX_HEADER_BYTES {
                return Err(SpdyError("a header block inflates beyond 256 KiB".into()));
            }
            let (in_before, out_before) = (self.inflate.total_in(), out.len());
            match self.inflate.decompress_vec(input, &mut out, FlushDecompress::Sync) {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| SpdyError(format!("header dictionary: {e}")))?;
                }
                Err(e) => return Err(SpdyError(format!("cannot inflate a header block: {e}"))),
            }
            input = &input[(self.inflate.total_in() - in_before) as usize..];
            let full = out.len() == out.capacity();
            if input.is_empty() && (!full || out.len() == out_before) {
                break;
            }
        }
        parse_block(&out)
    }

    /// Encodes and deflates one header block.
    pub fn encode(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = (headers.len() as u32).to_be_bytes().to_vec();
        for (k, v) in headers {
            for s in [k.to_ascii_lowercase().as_str(), v] {
                raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                raw.extend_from_slice(s.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(1024);
            }
            let before = self.deflate.total_in();
            self.deflate.compress_vec(input, &mut out, FlushCompress::Sync).expect("deflate into memory");
            input = &input[(self.deflate.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                return out;
            }
        }
    }
}

fn parse_block(b: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let count = be32(b, 0)? as usize;
    let mut at = 4;
    let mut out = Vec::new();
    let take = |at: &mut usize| -> Result<String, SpdyError> {
        let n = be32(b, *at)? as usize;
        let s = b.get(*at + 4..*at + 4 + n).ok_or_else(|| SpdyError("a header block is cut short".into()))?;
        *at += 4 + n;
        String::from_utf8(s.to_vec()).map_err(|_| SpdyError("a header is not UTF-8".into()))
    };
    for _ in 0..count.min(1024) {
        let name = take(&mut at)?.to_ascii_lowercase();
        let value = take(&mut at)?;
        out.extend(value.split('\0').map(|v| (name.clone(), v.to_string())));
    }
    Ok(out)
}

/// A stream the client opened.
pub struct Stream {
    pub id: u32,
    pub headers: Vec<(String, String)>,
    /// What the client sends on it; ends at its FIN (or a reset, or the session's end).
    pub data: mpsc::Receiver<Bytes>,
    pub writer: Writer,
}

impl Stream {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

enum Out {
    Frame(Vec<u8>),
    /// A data frame, kept as header and payload so the payload is not copied on the way.
    Data {
        head: [u8; 8],
        body: Bytes,
    },
    /// A data frame whose payload waits in a pipe (see [`super::zerocopy`]); the pipe goes back
    /// through `back` once emptied.
    Spliced {
        head: [u8; 8],
        pipe: Pipe,
        len: usize,
        back: oneshot::Sender<Pipe>,
    },
    /// Send GOAWAY and close the connection.
    Close,
}

/// Writes on one stream of a session.
#[derive(Clone)]
pub struct Writer {
    id: u32,
    out: mpsc::Sender<Out>,
    splices: bool,
}

impl Writer {
    /// Sends `data`; false once the session is gone.
    pub async fn write(&self, data: Bytes) -> bool {
        let mut at = 0;
        while at < data.len() {
            let body = data.slice(at..data.len().min(at + MAX_DATA_FRAME));
            at += body.len();
            let head = data_head(self.id, false, body.len());
            if self.out.send(Out::Data { head, body }).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Whether the session's connection takes payloads by splice ([`Writer::write_pipe`]).
    pub fn splices(&self) -> bool {
        self.splices
    }

    /// Sends the `len` bytes `pipe` holds (at most one data frame's worth) as one data frame;
    /// the pipe comes back through the receiver once emptied. None once the session is gone.
    pub async fn write_pipe(&self, pipe: Pipe, len: usize) -> Option<oneshot::Receiver<Pipe>> {
        debug_assert!(len <= MAX_DATA_FRAME);
        let (back, rx) = oneshot::channel();
        let head = data_head(self.id, false, len);
        self.out.send(Out::Spliced { head, pipe, len, back }).await.ok()?;
        Some(rx)
    }

    /// Half-closes the stream (FIN).
    pub async fn close(&self) {
        let _ = self.out.send(Out::Frame(data_frame(self.id, true, &[]))).await;
    }

    /// Resets the stream (CANCEL).
    pub async fn reset(&self) {
        let _ = self.out.send(Out::Frame(rst_stream(self.id, 5))).await;
    }
}

/// The session as a whole.
#[derive(Clone)]
pub struct Session {
    out: mpsc::Sender<Out>,
}

impl Session {
    /// Says GOAWAY, then closes the connection after what was already queued.
    pub async fn close(&self) {
        let _ = self.out.send(Out::Close).await;
    }
}

/// Where a session's frames go: a byte stream ([`IoSink`]) or WebSocket frames (kubectl's
/// tunnel, [`super::wstunnel::Sink`]).
pub trait FrameSink: Send + 'static {
    /// Writes one frame; false once the peer is gone.
    fn send(&mut self, head: &[u8], body: &[u8]) -> impl std::future::Future<Output = bool> + Send;
    /// Writes one frame whose payload is the `len` bytes `pipe` holds.
    fn send_spliced(&mut self, head: &[u8], pipe: &Pipe, len: usize) -> impl std::future::Future<Output = bool> + Send;
    /// Whether [`FrameSink::send_spliced`] splices rather than copies.
    fn splices(&self) -> bool;
    /// Ends the connection after what was sent.
    fn finish(self) -> impl std::future::Future<Output = ()> + Send;
}

/// Where a session's bytes come from.
pub trait ByteSource: Send + 'static {
    /// Appends what arrived to `buf`; false at the end of the connection.
    fn fill(&mut self, buf: &mut BytesMut) -> impl std::future::Future<Output = bool> + Send;
}

/// Writes `parts` whole, in as few vectored writes as the kernel allows.
pub(super) async fn write_all_vectored<W: AsyncWrite + Unpin>(w: &mut W, parts: &[&[u8]]) -> bool {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    while !parts.is_empty() {
        let slices: Vec<std::io::IoSlice> = parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
        match w.write_vectored(&slices).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => written(&mut parts, n),
        }
    }
    true
}

/// Drops the first `n` bytes of `parts`, which a vectored write took.
pub(super) fn written(parts: &mut Vec<&[u8]>, mut n: usize) {
    while n > 0 && !parts.is_empty() {
        if n >= parts[0].len() {
            n -= parts[0].len();
            parts.remove(0);
        } else {
            parts[0] = &parts[0][n..];
            n = 0;
        }
    }
}

/// Frames written as they are on a connection.
pub struct IoSink<W>(pub W);

impl<W: Wire> FrameSink for IoSink<W> {
    async fn send(&mut self, head: &[u8], body: &[u8]) -> bool {
        // Header and payload in one vectored write where the kernel takes both.
        self.0.write_parts(&[head, body]).await
    }

    async fn send_spliced(&mut self, head: &[u8], pipe: &Pipe, len: usize) -> bool {
        self.0.write_spliced(&[head], pipe, len).await
    }

    fn splices(&self) -> bool {
        self.0.splices()
    }

    async fn finish(mut self) {
        self.0.shutdown().await;
    }
}

pub struct IoSource<R>(pub R);

impl<R: AsyncRead + Unpin + Send + 'static> ByteSource for IoSource<R> {
    async fn fill(&mut self, buf: &mut BytesMut) -> bool {
        buf.reserve(16 << 10);
        matches!(self.0.read_buf(buf).await, Ok(n) if n > 0)
    }
}

/// Serves a SPDY session on `io` (the connection after the HTTP upgrade): replies to every
/// stream the client opens and hands it over. The receiver ends with the connection.
pub fn serve<IO>(io: IO) -> (Session, mpsc::Receiver<Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    serve_on(IoSource(rd), IoSink(zerocopy::Stream(wr)))
}

/// [`serve`] over any source and sink of the connection's bytes.
pub fn serve_on(source: impl ByteSource, sink: impl FrameSink) -> (Session, mpsc::Receiver<Stream>) {
    // Frames waiting for a slow client: at most 16 (8 MiB of port-forward data) per session.
    let (out_tx, out_rx) = mpsc::channel(16);
    let (accept_tx, accept_rx) = mpsc::channel(16);
    let splices = sink.splices();
    tokio::spawn(write_loop(sink, out_rx));
    tokio::spawn(read_loop(source, out_tx.clone(), accept_tx, splices));
    (Session { out: out_tx }, accept_rx)
}

async fn write_loop(mut sink: impl FrameSink, mut rx: mpsc::Receiver<Out>) {
    while let Some(out) = rx.recv().await {
        let sent = match out {
            Out::Frame(f) => sink.send(&f, &[]).await,
            Out::Data { head, body } => sink.send(&head, &body).await,
            Out::Spliced { head, pipe, len, back } => {
                let sent = sink.send_spliced(&head, &pipe, len).await;
                // A pipe left holding bytes is not used again.
                if sent {
                    let _ = back.send(pipe);
                }
                sent
            }
            Out::Close => {
                sink.send(&goaway(0), &[]).await;
                break;
            }
        };
        if !sent {
            break;
        }
    }
    sink.finish().await;
}

async fn read_loop(mut source: impl ByteSource, out: mpsc::Sender<Out>, accept: mpsc::Sender<Stream>, splices: bool) {
    let mut codec = HeaderCodec::default();
    let mut streams: std::collections::HashMap<u32, mpsc::Sender<Bytes>> = Default::default();
    let mut buf = BytesMut::with_capacity(16 << 10);
    loop {
        let frame = match parse(&mut buf) {
            Ok(Some(f)) => f,
            Ok(None) if source.fill(&mut buf).await => continue,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!("{e}");
                break;
            }
        };
        match frame {
            Frame::SynStream { stream, fin, block } => {
                let headers = match codec.decode(&block) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::debug!("{e}");
                        break;
                    }
                };
                let reply = syn_reply(stream, false, &codec.encode(&[]));
                if out.send(Out::Frame(reply)).await.is_err() {
                    break;
                }
                let (tx, rx) = mpsc::channel(64);
                if !fin {
                    streams.insert(stream, tx);
                }
                let s =
                    Stream { id: stream, headers, data: rx, writer: Writer { id: stream, out: out.clone(), splices } };
                if accept.send(s).await.is_err() {
                    break;
                }
            }
            Frame::Data { stream, fin, data } => {
                if let Some(tx) = streams.get(&stream) {
                    // A handler that stopped reading loses the rest, not the session.
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        streams.remove(&stream);
                    }
                }
                if fin {
                    streams.remove(&stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                streams.remove(&stream);
            }
            Frame::Ping(id) => {
                if out.send(Out::Frame(ping(id))).await.is_err() {
                    break;
                }
            }
            Frame::GoAway => break,
            Frame::SynReply { .. } | Frame::Other(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts written whole and in order, also when the peer takes a few bytes at a time.
    #[tokio::test]
    async fn vectored_writes_go_out_whole_through_a_narrow_pipe() {
        let (mut w, mut r) = tokio::io::duplex(7);
        let reader = tokio::spawn(async move {
            let mut got = vec![];
            r.read_to_end(&mut got).await.unwrap();
            got
        });
        let body: Vec<u8> = (0..100u8).collect();
        assert!(write_all_vectored(&mut w, &[b"head", &[], &body, b"tail"]).await);
        drop(w);
        let mut want = b"head".to_vec();
        want.extend(&body);
        want.extend(b"tail");
        assert_eq!(reader.await.unwrap(), want);
    }

    #[test]
    fn the_dictionary_is_the_specs() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b",enq=0."));
        // zlib names a preset dictionary by its Adler-32; SPDY/3 peers expect this one.
        let mut c = Compress::new(Compression::default(), true);
        assert_eq!(c.set_dictionary(d).unwrap(), 0xe3c6_a7c2);
    }

    #[test]
    fn header_blocks_round_trip_on_one_zlib_stream() {
        let (mut client, mut server) = (HeaderCodec::default(), HeaderCodec::default());
        let a = client.encode(&[("streamType", "error"), ("port", "80"), ("requestID", "0")]);
        let b = client.encode(&[("streamType", "data"), ("port", "80"), ("requestID", "0")]);
        assert_eq!(server.decode(&a).unwrap()[0], ("streamtype".into(), "error".into()));
        assert_eq!(server.decode(&b).unwrap()[0], ("streamtype".into(), "data".into()));
        assert!(server.decode(b"garbage").is_err());
    }

    #[test]
    fn frames_parse_whole_or_not_at_all() {
        let mut codec = HeaderCodec::default();
        let mut wire = BytesMut::new();
        wire.extend_from_slice(&syn_stream(1, false, &codec.encode(&[("a", "b")])));
        wire.extend_from_slice(&data_frame(1, true, b"hello"));
        wire.extend_from_slice(&ping(7));
        let mut partial = BytesMut::from(&wire[..5]);
        assert_eq!(parse(&mut partial).unwrap(), None);
        assert!(matches!(parse(&mut wire).unwrap(), Some(Frame::SynStream { stream: 1, fin: false, .. })));
        assert_eq!(
            parse(&mut wire).unwrap(),
            Some(Frame::Data { stream: 1, fin: true, data: Bytes::from_static(b"hello") })
        );
        assert_eq!(parse(&mut wire).unwrap(), Some(Frame::Ping(7)));
        assert!(wire.is_empty());
        let mut v2 = BytesMut::from(&[0x80, 0x02, 0, 1, 0, 0, 0, 0][..]);
        assert!(parse(&mut v2).is_err());
        let mut huge = BytesMut::from(&[0x80, 0x03, 0, 1, 0, 0xff, 0xff, 0xff][..]);
        assert!(parse(&mut huge).is_ok(), "16 MiB - 1 is allowed (and incomplete)");
    }

    #[tokio::test]
    async fn a_session_replies_to_streams_and_carries_data() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (session, mut streams) = serve(server);
        let (mut crd, mut cwr) = tokio::io::split(client);
        let mut codec = HeaderCodec::default();
        cwr.write_all(&syn_stream(1, false, &codec.encode(&[("streamType", "stdin")]))).await.unwrap();
        cwr.write_all(&data_frame(1, true, b"in")).await.unwrap();
        cwr.write_all(&ping(3)).await.unwrap();
        let mut s = streams.recv().await.unwrap();
        assert_eq!(s.header("streamtype"), Some("stdin"));
        assert_eq!(s.data.recv().await.unwrap(), Bytes::from_static(b"in"));
        assert!(s.data.recv().await.is_none(), "FIN ends the stream's data");
        assert!(s.writer.write(Bytes::from_static(b"out")).await);
        s.writer.close().await;
        session.close().await;
        let mut got = Vec::new();
        crd.read_to_end(&mut got).await.unwrap();
        let mut buf = BytesMut::from(&got[..]);
        let mut frames = vec![];
        while let Some(f) = parse(&mut buf).unwrap() {
            frames.push(f);
        }
        assert!(matches!(frames[0], Frame::SynReply { stream: 1, .. }));
        let Frame::SynReply { block, .. } = &frames[0] else { unreachable!() };
        assert_eq!(codec.decode(block).unwrap(), vec![]);
        assert_eq!(frames[1], Frame::Ping(3));
        assert_eq!(frames[2], Frame::Data { stream: 1, fin: false, data: Bytes::from_static(b"out") });
        assert_eq!(frames[3], Frame::Data { stream: 1, fin: true, data: Bytes::new() });
        assert_eq!(frames[4], Frame::GoAway);
    }
}
