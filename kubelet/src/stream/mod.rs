//! Kubelet's streaming API on the node agent: exec, attach and port-forward over WebSockets
//! (the channel protocols, and SPDY tunnelled in WebSocket messages) and over SPDY/3.1. The API
//! server authenticates the client and passes the upgraded connection through; everything
//! protocol-specific happens here. Protocols are in [`channel`] and [`spdy`]; what runs in the
//! pod is in [`exec`] and [`portforward`]; this module joins them.

pub mod channel;
pub mod console;
pub mod exec;
pub mod portforward;
pub mod spdy;
pub mod wstunnel;
pub mod zerocopy;

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use channel::{Proto, ERROR, RESIZE, STDERR, STDIN, STDOUT};
use exec::{ExecOptions, Input, Outcome, Output, Target};

/// How long kubelet waits for a SPDY client to open the streams it asked for.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The SPDY subprotocols (`X-Stream-Protocol-Version`) exec and attach accept, best first.
pub const SPDY_EXEC_PROTOCOLS: &[&str] =
    &["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"];
pub const SPDY_PORTFORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// Who a port-forward is for (the error messages name the pod).
#[derive(Debug, Clone)]
pub struct PodRef {
    pub name: String,
    pub uid: String,
    pub sandbox_pid: i32,
}

async fn finish_ws(mut sink: futures::stream::SplitSink<WebSocket, Message>) {
    let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
    let _ = sink.close().await;
}

/// A client message's channel and payload; `None` when the client closes, `Some(None)` for
/// messages that carry none (pings, undecodable ones).
fn decode(proto: Proto, msg: &Message) -> Option<Option<(u8, Vec<u8>)>> {
    match msg {
        Message::Binary(b) => Some(proto.decode(Some(b), None)),
        Message::Text(t) => Some(proto.decode(None, Some(t.as_str()))),
        Message::Close(_) => None,
        _ => Some(None),
    }
}

fn ws_message(proto: Proto, channel: u8, data: &[u8]) -> Message {
    match proto.encode(channel, data) {
        Ok(b) => Message::Binary(Bytes::from(b)),
        Err(t) => Message::Text(t.into()),
    }
}

/// Exec (or attach, with a different `run`) over a WebSocket channel protocol.
pub async fn exec_ws<F, Fut>(ws: WebSocket, proto: Proto, opts: ExecOptions, run: F)
where
    F: FnOnce(mpsc::Receiver<Input>, mpsc::Sender<Output>) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let (mut sink, mut source) = ws.split();
    let (in_tx, in_rx) = mpsc::channel::<Input>(16);
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(16);
    // Ends (dropping in_tx, which stops the command) when the client goes away.
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = source.next().await {
            let Some(decoded) = decode(proto, &msg) else { break };
            let inputs = match decoded {
                Some((STDIN, data)) => vec![Input::Stdin(data.into())],
                Some((RESIZE, data)) => channel::terminal_sizes(&data)
                    .into_iter()
                    .map(|s| Input::Resize { width: s.width, height: s.height })
                    .collect(),
                Some((channel::CLOSE, data)) if proto.version >= 5 && data.first() == Some(&STDIN) => {
                    vec![Input::StdinClosed]
                }
                _ => continue,
            };
            for i in inputs {
                if in_tx.send(i).await.is_err() {
                    return;
                }
            }
        }
    });
    let command = opts.command.clone();
    let running = run(in_rx, out_tx);
    tokio::pin!(running);
    let send = |o: Output| match o {
        Output::Stdout(b) => ws_message(proto, STDOUT, &b),
        Output::Stderr(b) => ws_message(proto, STDERR, &b),
    };
    let outcome = loop {
        tokio::select! {
            o = &mut running => break o,
            Some(o) = out_rx.recv() => {
                if sink.send(send(o)).await.is_err() {
                    reader.abort();
                    return; // the client is gone; dropping `running` kills the command
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(o) = out_rx.recv().await {
            if sink.send(send(o)).await.is_err() {
                break;
            }
        }
    })
    .await;
    let status = if proto.status_json() {
        serde_json::to_string(&exec::status(&command, &outcome)).unwrap_or_default()
    } else {
        exec::status_text(&command, &outcome)
    };
    if !status.is_empty() {
        let _ = sink.send(ws_message(proto, ERROR, status.as_bytes())).await;
    }
    reader.abort();
    finish_ws(sink).await;
}

/// Exec (or attach) over SPDY: the client opens an `error` stream and one per standard stream
/// (and `resize` with a TTY); the status goes on `error` at the end.
pub async fn exec_spdy<IO, F, Fut>(io: IO, version: u8, opts: ExecOptions, run: F)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
    F: FnOnce(mpsc::Receiver<Input>, mpsc::Sender<Output>) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let (session, mut incoming) = spdy::serve(io);
    let mut streams: HashMap<String, spdy::Stream> = HashMap::new();
    let mut wanted = vec!["error"];
    if opts.stdin {
        wanted.push("stdin");
    }
    if opts.stdout {
        wanted.push("stdout");
    }
    if opts.stderr {
        wanted.push("stderr");
    }
    if opts.tty && version >= 3 {
        wanted.push("resize");
    }
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while !wanted.iter().all(|w| streams.contains_key(*w)) {
        match tokio::time::timeout_at(deadline, incoming.recv()).await {
            Ok(Some(s)) => {
                let kind = s.header("streamtype").unwrap_or("").to_string();
                streams.insert(kind, s);
            }
            Ok(None) => return,
            Err(_) => {
                tracing::debug!("a SPDY exec client did not open its streams in time");
                session.close().await;
                return;
            }
        }
    }
    let (in_tx, in_rx) = mpsc::channel::<Input>(16);
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(16);
    let mut inputs = tokio::task::JoinSet::new();
    if let Some(mut s) = streams.remove("stdin") {
        let tx = in_tx.clone();
        inputs.spawn(async move {
            while let Some(b) = s.data.recv().await {
                if tx.send(Input::Stdin(b)).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(Input::StdinClosed).await;
        });
    }
    if let Some(mut s) = streams.remove("resize") {
        let tx = in_tx.clone();
        inputs.spawn(async move {
            while let Some(b) = s.data.recv().await {
                for sz in channel::terminal_sizes(&b) {
                    let _ = tx.send(Input::Resize { width: sz.width, height: sz.height }).await;
                }
            }
        });
    }
    // Holds the input open until the connection ends (no more streams can come then).
    inputs.spawn(async move {
        while incoming.recv().await.is_some() {}
        drop(in_tx);
    });
    let writer = |name: &str| streams.get(name).map(|s| s.writer.clone());
    let (stdout, stderr, error) = (writer("stdout"), writer("stderr"), writer("error"));
    let command = opts.command.clone();
    let running = run(in_rx, out_tx);
    tokio::pin!(running);
    let forward = |o: Output| {
        let (w, b) = match o {
            Output::Stdout(b) => (stdout.clone(), b),
            Output::Stderr(b) => (stderr.clone(), b),
        };
        async move {
            match w {
                Some(w) => w.write(b).await,
                None => true,
            }
        }
    };
    let outcome = loop {
        tokio::select! {
            o = &mut running => break o,
            Some(o) = out_rx.recv() => {
                if !forward(o).await {
                    inputs.abort_all();
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(o) = out_rx.recv().await {
            if !forward(o).await {
                break;
            }
        }
    })
    .await;
    let status = if version >= 4 {
        serde_json::to_string(&exec::status(&command, &outcome)).unwrap_or_default()
    } else {
        exec::status_text(&command, &outcome)
    };
    if let Some(e) = error {
        if !status.is_empty() {
            e.write(Bytes::from(status)).await;
        }
    }
    for s in streams.values() {
        s.writer.close().await;
    }
    inputs.abort_all();
    session.close().await;
}

/// The most a forwarded connection reads at once (one SPDY frame or WebSocket message). Large:
/// kubectl's cost is per frame as much as per byte (64 KiB frames cost it 1.7× the CPU of
/// 512 KiB ones for the same bytes; see the streaming bench).
const SPLICE_CHUNK: usize = 512 << 10;

/// The client's bytes into a forwarded connection; its write side closes after them.
async fn to_pod(mut wr: tokio::net::tcp::OwnedWriteHalf, mut from_client: mpsc::Receiver<Bytes>) {
    while let Some(b) = from_client.recv().await {
        if wr.write_all(&b).await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// Copies between a forwarded connection and its client streams until both directions end.
async fn splice(
    tcp: tokio::net::TcpStream,
    from_client: mpsc::Receiver<Bytes>,
    to_client: impl Fn(Bytes) -> futures::future::BoxFuture<'static, bool> + Send + 'static,
) {
    let (mut rd, wr) = tcp.into_split();
    let down = async move {
        // Read straight into buffers handed on without copying; a buffer is reused once the
        // client side has written what was split off it.
        let mut buf = bytes::BytesMut::new();
        loop {
            buf.reserve(SPLICE_CHUNK);
            match rd.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {
                    if !to_client(buf.split().freeze()).await {
                        return;
                    }
                }
                _ => return,
            }
        }
    };
    tokio::join!(to_pod(wr, from_client), down);
}

/// Pipes a forwarded connection uses toward a client that takes splices: one fills while the
/// other drains.
const PIPES: usize = 2;

/// [`splice`] for a SPDY stream on a connection that takes splices: the pod's bytes move by
/// `splice(2)` into a pipe and from there into the tunnel, never through our memory.
async fn splice_through_pipes(
    tcp: tokio::net::TcpStream,
    from_client: mpsc::Receiver<Bytes>,
    writer: spdy::Writer,
    mut spare: Vec<zerocopy::Pipe>,
) {
    let (rd, wr) = tcp.into_split();
    let down = async move {
        let mut in_flight = std::collections::VecDeque::new();
        loop {
            let pipe = match spare.pop() {
                Some(p) => p,
                None => match in_flight.pop_front() {
                    Some(back) => match back.await {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    None => return,
                },
            };
            let max = zerocopy::PIPE_BYTES.min(spdy::MAX_DATA_FRAME);
            match pipe.fill_from(rd.as_ref(), max).await {
                Ok(n) if n > 0 => match writer.write_pipe(pipe, n).await {
                    Some(back) => in_flight.push_back(back),
                    None => return,
                },
                _ => return,
            }
        }
    };
    tokio::join!(to_pod(wr, from_client), down);
}

/// Port-forward over SPDY: every forwarded connection is a `data` and an `error` stream with
/// the same `requestID`.
pub async fn portforward_spdy(session: (spdy::Session, mpsc::Receiver<spdy::Stream>), pod: PodRef) {
    let (_session, mut incoming) = session;
    let mut pending: HashMap<String, (Option<spdy::Stream>, Option<spdy::Stream>)> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(s) = incoming.recv().await {
        let id = s.header("requestid").unwrap_or("").to_string();
        let entry = pending.entry(id.clone()).or_default();
        match s.header("streamtype") {
            Some("error") => entry.0 = Some(s),
            Some("data") => entry.1 = Some(s),
            _ => {
                s.writer.reset().await;
                continue;
            }
        }
        if let (Some(_), Some(_)) = entry {
            let Some((Some(error), Some(data))) = pending.remove(&id) else { continue };
            tasks.spawn(forward_spdy(error, data, pod.clone()));
        }
        // Finished forwards are reaped as new ones come.
        while tasks.try_join_next().is_some() {}
    }
    // The connection is gone: so are its forwards.
    tasks.abort_all();
}

async fn forward_spdy(error: spdy::Stream, data: spdy::Stream, pod: PodRef) {
    let port = data.header("port").and_then(|p| p.parse::<u16>().ok()).filter(|p| *p > 0);
    let result = match port {
        Some(port) => portforward::dial(pod.sandbox_pid, port).await.map(|t| (port, t)),
        None => Err(format!("invalid port {:?}", data.header("port").unwrap_or(""))),
    };
    match result {
        Ok((_, tcp)) => {
            let pipes = data.writer.splices().then(|| (0..PIPES).map(|_| zerocopy::Pipe::new()).collect());
            match pipes {
                Some(Ok(pipes)) => splice_through_pipes(tcp, data.data, data.writer.clone(), pipes).await,
                // No pipes (out of descriptors?): the copying relay still works.
                _ => {
                    let w = data.writer.clone();
                    splice(tcp, data.data, move |b| {
                        let w = w.clone();
                        Box::pin(async move { w.write(b).await })
                    })
                    .await
                }
            }
        }
        Err(e) => {
            let msg = portforward::forward_error(port.unwrap_or(0), &pod.name, &pod.uid, &e);
            error.writer.write(Bytes::from(msg)).await;
        }
    }
    data.writer.close().await;
    error.writer.close().await;
}

/// Port-forward over the WebSocket channel protocol: for the i-th port, channel 2i carries data
/// and 2i+1 errors; each starts with the port number (little endian), as kubelet sends it.
pub async fn portforward_ws(ws: WebSocket, proto: Proto, ports: Vec<u16>, pod: PodRef) {
    let (mut sink, mut source) = ws.split();
    let (msg_tx, mut msg_rx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = msg_rx.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        finish_ws(sink).await;
    });
    let mut to_pod = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (data_ch, err_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        for ch in [data_ch, err_ch] {
            let _ = msg_tx.send(ws_message(proto, ch, &port.to_le_bytes())).await;
        }
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        to_pod.push(tx);
        let (msg_tx, pod) = (msg_tx.clone(), pod.clone());
        tasks.spawn(async move {
            match portforward::dial(pod.sandbox_pid, port).await {
                Ok(tcp) => {
                    splice(tcp, rx, move |b| {
                        let msg_tx = msg_tx.clone();
                        Box::pin(async move { msg_tx.send(ws_message(proto, data_ch, &b)).await.is_ok() })
                    })
                    .await
                }
                Err(e) => {
                    let msg = portforward::forward_error(port, &pod.name, &pod.uid, &e);
                    let _ = msg_tx.send(ws_message(proto, err_ch, msg.as_bytes())).await;
                }
            }
        });
    }
    drop(msg_tx);
    let reader = async {
        while let Some(Ok(msg)) = source.next().await {
            let Some(decoded) = decode(proto, &msg) else { break };
            if let Some((ch, data)) = decoded {
                if ch % 2 == 0 {
                    if let Some(tx) = to_pod.get((ch / 2) as usize) {
                        let _ = tx.send(data.into()).await;
                    }
                }
            }
        }
        to_pod.clear();
    };
    tokio::select! {
        _ = reader => tasks.abort_all(),
        _ = async { while tasks.join_next().await.is_some() {} } => {}
    }
    drop(tasks);
    let _ = writer.await;
}

/// The target of an exec in a pod.
pub fn exec_target(
    workload_bin: std::path::PathBuf,
    sandbox_pid: i32,
    pid_file: Option<std::path::PathBuf>,
    pod: &str,
    tty: bool,
) -> Target {
    let mut env = vec![
        ("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()),
        ("HOSTNAME".to_string(), pod.to_string()),
        ("HOME".to_string(), "/root".to_string()),
    ];
    if tty {
        env.push(("TERM".to_string(), "xterm".to_string()));
    }
    Target { workload_bin, sandbox_pid, pid_file, env }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (a, l.accept().await.unwrap().0)
    }

    /// The application in the pod: sends `sent`, closes its side, returns what it received.
    fn app(mut conn: tokio::net::TcpStream, sent: Vec<u8>) -> tokio::task::JoinHandle<Vec<u8>> {
        tokio::spawn(async move {
            conn.write_all(&sent).await.unwrap();
            conn.shutdown().await.unwrap();
            let mut up = vec![];
            conn.read_to_end(&mut up).await.unwrap();
            up
        })
    }

    /// What the pod sends reaches the client whole and in order, whether the client lets go of
    /// what it got at once or holds on to it; and the client's bytes reach the pod.
    #[tokio::test]
    async fn spliced_bytes_arrive_whole_and_in_order_whatever_the_client_holds() {
        let (pod, ours) = tcp_pair().await;
        let sent: Vec<u8> = (0..(6usize << 20)).map(|i| (i % 251) as u8).collect();
        let (to_pod, from_client) = mpsc::channel(4);
        let (got_tx, mut got_rx) = mpsc::unbounded_channel::<Bytes>();
        let relay = tokio::spawn(splice(ours, from_client, move |b| {
            let tx = got_tx.clone();
            Box::pin(async move { tx.send(b).is_ok() })
        }));
        let pod_side = app(pod, sent.clone());
        to_pod.send(Bytes::from_static(b"from the client")).await.unwrap();
        drop(to_pod);
        // The first half of the bytes let go of at once (their buffers come back), the rest
        // kept until the end (the relay runs out of reusable buffers and takes fresh ones).
        let (mut got, mut held) = (Vec::new(), Vec::new());
        while let Some(b) = got_rx.recv().await {
            got.extend_from_slice(&b);
            if got.len() > sent.len() / 2 {
                held.push(b);
            }
        }
        assert!(got == sent, "the bytes differ");
        assert!(held.len() > 1, "{} reads held", held.len());
        assert_eq!(pod_side.await.unwrap(), b"from the client");
        relay.await.unwrap();
    }

    /// Through a session on a connection that takes splices, the pod's bytes reach the client
    /// as data frames, whole and in order, and the client's reach the pod.
    #[tokio::test]
    async fn bytes_spliced_through_pipes_arrive_as_data_frames_whole_and_in_order() {
        let ((mut client, tunnel), (app_end, ours)) = (tcp_pair().await, tcp_pair().await);
        let (rd, wr) = tunnel.into_split();
        let (session, mut streams) = spdy::serve_on(spdy::IoSource(rd), spdy::IoSink(zerocopy::TcpWire(wr)));
        let mut codec = spdy::HeaderCodec::default();
        client.write_all(&spdy::syn_stream(1, false, &codec.encode(&[("streamType", "data")]))).await.unwrap();
        client.write_all(&spdy::data_frame(1, true, b"from the client")).await.unwrap();
        let s = streams.recv().await.unwrap();
        assert!(s.writer.splices());
        let pipes = (0..PIPES).map(|_| zerocopy::Pipe::new().unwrap()).collect();
        let relay = tokio::spawn(splice_through_pipes(ours, s.data, s.writer.clone(), pipes));
        let sent: Vec<u8> = (0..(6usize << 20) + 3).map(|i| (i % 251) as u8).collect();
        let app_side = app(app_end, sent.clone());
        let reader = tokio::spawn(async move {
            let mut got = vec![];
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        assert_eq!(app_side.await.unwrap(), b"from the client");
        relay.await.unwrap();
        s.writer.close().await;
        session.close().await;
        let mut wire = bytes::BytesMut::from(&reader.await.unwrap()[..]);
        let (mut data, mut frames, mut fin) = (vec![], 0, false);
        while let Some(f) = spdy::parse(&mut wire).unwrap() {
            if let spdy::Frame::Data { stream: 1, fin: f, data: d } = f {
                assert!(!fin, "data after FIN");
                data.extend_from_slice(&d);
                (frames, fin) = (frames + 1, f);
            }
        }
        assert!(wire.is_empty());
        assert!(fin);
        assert!(frames > 2, "{frames} frames");
        assert!(data == sent, "the bytes differ ({} of {})", data.len(), sent.len());
    }
}
