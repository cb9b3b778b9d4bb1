//! Port-forward's bytes from the pod to the API server without passing through the agent's
//! memory: `splice(2)` moves them from the pod's socket into a pipe, and from the pipe into
//! the connection the API server opened, after the frame's header. A relay through a buffer
//! copies every byte twice (socket → buffer → socket): in a port-forward pull those copies were
//! about half of the agent's CPU (`perf`, the streaming bench).
//!
//! To splice into the API server's connection the agent needs that socket, which hyper keeps
//! after the upgrade behind a type of its own. So the kubelet server hands each accepted
//! connection's socket to its requests ([`Socket`], a duplicate of the descriptor), and
//! [`take_over`] moves a plain HTTP/1.1 upgraded connection onto it: it first takes whatever
//! hyper already read past the request, then lets go of hyper's handle.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{sendmsg, MsgFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A pipe's capacity (Linux's default `pipe-max-size`); one chunk of a pull fits whole.
pub const PIPE_BYTES: usize = 1 << 20;

/// A pipe, both ends non-blocking; a chunk of a forwarded connection's bytes waits in it
/// between the pod's socket and the tunnel.
pub struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A smaller pipe (the limit lowered, or no privilege) only means smaller chunks.
        let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32));
        Ok(Pipe { r, w })
    }

    /// Moves up to `max` of the bytes waiting on `tcp` into the pipe, which must be empty
    /// (then the only reason to wait is the socket); 0 at the connection's end.
    pub async fn fill_from(&self, tcp: &TcpStream, max: usize) -> io::Result<usize> {
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        loop {
            tcp.readable().await?;
            match tcp.try_io(Interest::READABLE, || Ok(splice(tcp, None, &self.w, None, max, flags)?)) {
                Err(e) if would_block(&e) => continue,
                r => return r,
            }
        }
    }

    /// Moves the `len` bytes the pipe holds into `tcp`.
    pub async fn drain_to(&self, tcp: &TcpStream, mut len: usize) -> io::Result<()> {
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        while len > 0 {
            tcp.writable().await?;
            match tcp.try_io(Interest::WRITABLE, || Ok(splice(&self.r, None, tcp, None, len, flags)?)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => len -= n,
                Err(e) if would_block(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes `data` into the pipe (tests fill it without a socket).
    #[cfg(test)]
    pub fn put(&self, data: &[u8]) -> io::Result<usize> {
        Ok(nix::unistd::write(&self.w, data)?)
    }

    /// Reads the `len` bytes the pipe holds, for a connection that cannot take a splice.
    pub fn read_all(&self, len: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0; len];
        let mut at = 0;
        while at < len {
            match nix::unistd::read(&self.r, &mut out[at..])? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => at += n,
            }
        }
        Ok(out)
    }
}

/// The writing side of a connection frames go out on.
pub trait Wire: Send + 'static {
    /// Writes `parts` whole; false once the peer is gone.
    fn write_parts(&mut self, parts: &[&[u8]]) -> impl Future<Output = bool> + Send;
    /// Writes `parts`, then the `len` bytes `pipe` holds.
    fn write_spliced(&mut self, parts: &[&[u8]], pipe: &Pipe, len: usize) -> impl Future<Output = bool> + Send;
    /// Whether [`Wire::write_spliced`] splices (else it copies, and a pipe gains nothing).
    fn splices(&self) -> bool;
    /// Ends the write side after what was written.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send;
}

/// Any byte stream as a [`Wire`]: a pipe's bytes are read out and written.
pub struct Stream<W>(pub W);

impl<W: AsyncWrite + Unpin + Send + 'static> Wire for Stream<W> {
    async fn write_parts(&mut self, parts: &[&[u8]]) -> bool {
        super::spdy::write_all_vectored(&mut self.0, parts).await
    }

    async fn write_spliced(&mut self, parts: &[&[u8]], pipe: &Pipe, len: usize) -> bool {
        let Ok(body) = pipe.read_all(len) else { return false };
        let mut all = parts.to_vec();
        all.push(&body);
        self.write_parts(&all).await
    }

    fn splices(&self) -> bool {
        false
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// A TCP connection's write half as a [`Wire`] that splices.
pub struct TcpWire(pub OwnedWriteHalf);

impl TcpWire {
    /// Sends `parts` whole; with `more`, tells the kernel more follows at once (`MSG_MORE`), so
    /// a frame's header and its spliced payload leave in the same segments.
    async fn send_all(&self, parts: &[&[u8]], more: bool) -> io::Result<()> {
        let tcp: &TcpStream = self.0.as_ref();
        // nix names no MSG_MORE; its value is the kernel's, from libc.
        let flags = if more { MsgFlags::from_bits_retain(nix::libc::MSG_MORE) } else { MsgFlags::empty() };
        let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        while !parts.is_empty() {
            tcp.writable().await?;
            let iov: Vec<io::IoSlice> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
            let sent = tcp.try_io(Interest::WRITABLE, || {
                Ok(sendmsg::<()>(tcp.as_raw_fd(), &iov, &[], flags | MsgFlags::MSG_NOSIGNAL, None)?)
            });
            match sent {
                Ok(n) => super::spdy::written(&mut parts, n),
                Err(e) if would_block(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Wire for TcpWire {
    async fn write_parts(&mut self, parts: &[&[u8]]) -> bool {
        self.send_all(parts, false).await.is_ok()
    }

    async fn write_spliced(&mut self, parts: &[&[u8]], pipe: &Pipe, len: usize) -> bool {
        self.send_all(parts, true).await.is_ok() && pipe.drain_to(self.0.as_ref(), len).await.is_ok()
    }

    fn splices(&self) -> bool {
        true
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// An accepted connection's socket (a duplicate of its descriptor), given to every request on
/// it as axum's connect info; None when it could not be duplicated.
#[derive(Clone, Debug)]
pub struct Socket(Option<Arc<OwnedFd>>);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>> for Socket {
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Socket(stream.io().as_fd().try_clone_to_owned().ok().map(Arc::new))
    }
}

/// What hyper's upgraded connection has ready without waiting: bytes it read past the request,
/// then any the socket holds now (up to its end, which our own reads then see too). `Err` when
/// the connection failed.
fn ready_bytes(io: &mut TokioIo<hyper::upgrade::Upgraded>) -> io::Result<BytesMut> {
    let mut got = BytesMut::new();
    let mut cx = Context::from_waker(Waker::noop());
    let mut buf = [0u8; 16 << 10];
    loop {
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(&mut *io).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => return Ok(got),
            Poll::Ready(Ok(())) => got.extend_from_slice(rb.filled()),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(got),
        }
    }
}

/// The read side of a taken-over connection: hyper's leftover bytes, then the socket.
pub type TakenRead = tokio::io::Chain<io::Cursor<Bytes>, OwnedReadHalf>;

/// Moves an upgraded HTTP/1.1 connection from hyper onto `socket`, its own descriptor: the
/// read side yields what hyper held first. `Err` gives the connection back when it cannot be
/// taken (no socket, or no second descriptor of it), or had failed.
pub fn take_over(
    mut io: TokioIo<hyper::upgrade::Upgraded>,
    socket: &Socket,
) -> Result<(TakenRead, TcpWire), TokioIo<hyper::upgrade::Upgraded>> {
    let Some(fd) = &socket.0 else { return Err(io) };
    let tcp = match fd.try_clone().and_then(|fd| {
        let std = std::net::TcpStream::from(fd);
        std.set_nonblocking(true)?;
        TcpStream::from_std(std)
    }) {
        Ok(t) => t,
        Err(_) => return Err(io),
    };
    let Ok(held) = ready_bytes(&mut io) else { return Err(io) };
    // hyper's handle goes (its descriptor closed, the connection kept open by ours).
    drop(io);
    let (rd, wr) = tcp.into_split();
    Ok((io::Cursor::new(held.freeze()).chain(rd), TcpWire(wr)))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (a, l.accept().await.unwrap().0)
    }

    /// Bytes spliced from one socket through a pipe into another arrive whole and in order,
    /// each chunk after its header; the same through a wire that copies the pipe out.
    async fn relay(wire: &mut impl Wire, pod: TcpStream, peer: TcpStream, sent: &[u8]) {
        let pipe = Pipe::new().unwrap();
        let mut want = vec![];
        let reader = tokio::spawn(async move {
            let mut peer = peer;
            let mut got = vec![];
            peer.read_to_end(&mut got).await.unwrap();
            got
        });
        let (mut at, mut chunks) = (0, 0);
        loop {
            let n = pipe.fill_from(&pod, PIPE_BYTES).await.unwrap();
            if n == 0 {
                break;
            }
            let head = (n as u32).to_be_bytes();
            assert!(wire.write_spliced(&[b"H", &head], &pipe, n).await);
            want.extend_from_slice(b"H");
            want.extend_from_slice(&head);
            want.extend_from_slice(&sent[at..at + n]);
            (at, chunks) = (at + n, chunks + 1);
        }
        wire.shutdown().await;
        assert_eq!(at, sent.len());
        assert!(chunks > 1, "{chunks} chunks");
        assert!(reader.await.unwrap() == want, "the bytes differ");
    }

    #[tokio::test]
    async fn chunks_spliced_through_a_pipe_arrive_whole_after_their_headers() {
        let sent: Vec<u8> = (0..(5usize << 20) + 7).map(|i| (i % 251) as u8).collect();
        for splicing in [true, false] {
            let (mut app, pod) = tcp_pair().await;
            let (tunnel, peer) = tcp_pair().await;
            let app_side = {
                let sent = sent.clone();
                tokio::spawn(async move { app.write_all(&sent).await.unwrap() })
            };
            let (_rd, wr) = tunnel.into_split();
            if splicing {
                let mut wire = TcpWire(wr);
                assert!(wire.splices());
                relay(&mut wire, pod, peer, &sent).await;
            } else {
                let mut wire = Stream(wr);
                assert!(!wire.splices());
                relay(&mut wire, pod, peer, &sent).await;
            }
            app_side.await.unwrap();
        }
    }

    /// A connection taken over after its upgrade keeps every byte, also those the client sent
    /// right behind its request (hyper read them already); what is written on it arrives.
    #[tokio::test]
    async fn a_taken_over_connection_keeps_the_bytes_hyper_read_past_the_request() {
        use axum::extract::{ConnectInfo, Request};
        use axum::response::IntoResponse;
        async fn up(req: Request) -> axum::response::Response {
            let socket = req.extensions().get::<ConnectInfo<Socket>>().map(|c| c.0.clone()).unwrap();
            let mut req = req;
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let io = TokioIo::new(on.await.unwrap());
                let Ok((mut rd, mut wr)) = take_over(io, &socket) else { panic!("not taken over") };
                let mut got = vec![];
                rd.read_to_end(&mut got).await.unwrap();
                assert!(wr.write_parts(&[b"echo:", &got]).await);
                wr.shutdown().await;
            });
            (axum::http::StatusCode::SWITCHING_PROTOCOLS, [("connection", "upgrade"), ("upgrade", "test")])
                .into_response()
        }
        let app = axum::Router::new().route("/up", axum::routing::get(up));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<Socket>()).await.unwrap()
        });
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /up HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: test\r\n\r\nearly,")
            .await
            .unwrap();
        let mut head = vec![];
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).await.unwrap(), 1);
            head.push(b[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        c.write_all(b"late").await.unwrap();
        c.shutdown().await.unwrap();
        let mut rest = vec![];
        c.read_to_end(&mut rest).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&rest), "echo:early,late");
        server.abort();
    }
}
