//! The Corefile's `forward` and `cache` in process, against an upstream resolver of the test's
//! own on loopback (UDP and TCP, counting what it is asked): names outside the cluster go
//! upstream and come back with its flags, a truncated UDP answer is asked again over TCP, the
//! cache answers a repeat, `except` and stub-domain blocks route, a dead upstream is SERVFAIL.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use podpath_dns::pipeline::Pipeline;
use podpath_dns::records::{Config, Zone};
use podpath_dns::server::{Handler, SharedPipeline, SharedZone};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An upstream: `*.example.com` has 192.0.2.N (N labels' count), `big.example.com` 100
/// addresses (truncated over UDP), other names NXDOMAIN; RA set.
fn upstream_answer(q: &Message) -> Message {
    let query = q.queries[0].clone();
    let mut m = Message::new(q.metadata.id, MessageType::Response, q.metadata.op_code);
    m.metadata.recursion_available = true;
    m.metadata.recursion_desired = q.metadata.recursion_desired;
    m.add_query(query.clone());
    let name = query.name().to_ascii().to_ascii_lowercase();
    if name == "big.example.com." {
        for i in 0..100u8 {
            m.add_answer(Record::from_rdata(query.name().clone(), 300, RData::A(A::new(192, 0, 2, i))));
        }
    } else if name.ends_with("example.com.") {
        let n = query.name().num_labels();
        m.add_answer(Record::from_rdata(query.name().clone(), 300, RData::A(A::new(192, 0, 2, n))));
    } else {
        m.metadata.response_code = ResponseCode::NXDomain;
    }
    m
}

struct Upstream {
    addr: SocketAddr,
    udp: Arc<AtomicUsize>,
    tcp: Arc<AtomicUsize>,
}

async fn upstream() -> Upstream {
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = udp.local_addr().unwrap();
    let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (nu, nt) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let n = nu.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((len, from)) = udp.recv_from(&mut buf).await {
            n.fetch_add(1, Ordering::SeqCst);
            let q = Message::from_vec(&buf[..len]).unwrap();
            let mut bytes = upstream_answer(&q).to_vec().unwrap();
            if bytes.len() > 512 {
                let mut t = upstream_answer(&q);
                t.answers.clear();
                t.metadata.truncation = true;
                bytes = t.to_vec().unwrap();
            }
            udp.send_to(&bytes, from).await.unwrap();
        }
    });
    let n = nt.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = tcp.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            let len = c.read_u16().await.unwrap() as usize;
            let mut buf = vec![0u8; len];
            c.read_exact(&mut buf).await.unwrap();
            let bytes = upstream_answer(&Message::from_vec(&buf).unwrap()).to_vec().unwrap();
            c.write_all(&(bytes.len() as u16).to_be_bytes()).await.unwrap();
            c.write_all(&bytes).await.unwrap();
        }
    });
    Upstream { addr, udp: nu, tcp: nt }
}

async fn server(corefile: &str) -> SocketAddr {
    let svc = serde_json::from_value(serde_json::json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.20"}}))
    .unwrap();
    let ext = serde_json::from_value(serde_json::json!({"metadata": {"name": "ext", "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "www.example.com"}}))
    .unwrap();
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = udp.local_addr().unwrap();
    let p = Pipeline::build(corefile, "Corefile", addr, &|f| std::fs::read_to_string(f)).unwrap();
    let zone = SharedZone::new(Zone::build(
        p.zone.clone().unwrap_or(Config::new("cluster.local", 5).unwrap()),
        &[svc, ext],
        &[],
        1,
    ));
    let mut s =
        hickory_server::Server::new(Handler { zone, metrics: Default::default(), pipeline: SharedPipeline::new(p) });
    s.register_socket(udp);
    tokio::spawn(async move {
        let _ = s.block_until_done().await;
    });
    addr
}

async fn ask(addr: SocketAddr, name: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.id = 77;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(&m.to_vec().unwrap(), addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(8), s.recv(&mut buf)).await.expect("an answer").unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

#[tokio::test]
async fn names_outside_the_cluster_go_upstream_and_repeats_come_from_the_cache() {
    let up = upstream().await;
    let dns = server(&format!(
        ". {{\n errors\n kubernetes cluster.local {{\n  pods insecure\n }}\n forward . {} {{\n  except skip.example.com\n }}\n cache 30 {{\n  disable success cluster.local\n }}\n}}\n",
        up.addr
    ))
    .await;
    let m = ask(dns, "www.example.com.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.recursion_available && !m.metadata.authoritative);
    assert_eq!(m.answers[0].to_string(), "www.example.com. 30 IN A 192.0.2.3", "the TTL capped by cache 30");
    assert_eq!(up.udp.load(Ordering::SeqCst), 1);
    // The repeat is the cache's.
    let again = ask(dns, "www.example.com.", RecordType::A).await;
    assert_eq!(again.answers.len(), 1);
    assert_eq!(up.udp.load(Ordering::SeqCst), 1);
    // NXDOMAIN from upstream, cached as a denial.
    assert_eq!(ask(dns, "nope.test.", RecordType::A).await.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(ask(dns, "nope.test.", RecordType::A).await.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(up.udp.load(Ordering::SeqCst), 2);
    // Cluster names stay the cluster's, never cached (disable success cluster.local).
    let web = ask(dns, "web.default.svc.cluster.local.", RecordType::A).await;
    assert!(web.metadata.authoritative && web.answers.len() == 1);
    assert_eq!(up.udp.load(Ordering::SeqCst), 2);
    // 100 addresses do not fit UDP upstream: asked again over TCP, whole to a TCP-less client
    // as far as its 512 bytes go (TC set).
    let big = ask(dns, "big.example.com.", RecordType::A).await;
    assert!(big.metadata.truncation);
    assert_eq!(up.tcp.load(Ordering::SeqCst), 1);
    // An ExternalName's target is followed through the server (here: its cache).
    let ext = ask(dns, "ext.default.svc.cluster.local.", RecordType::A).await;
    let names: Vec<String> = ext.answers.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        names,
        ["ext.default.svc.cluster.local. 5 IN CNAME www.example.com.", "www.example.com. 30 IN A 192.0.2.3"]
    );
    // `except`: not forwarded, and nothing else serves it.
    assert_eq!(ask(dns, "skip.example.com.", RecordType::A).await.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(
        up.udp.load(Ordering::SeqCst),
        3,
        "big.example.com went up; the ExternalName's target came from the cache"
    );
}

#[tokio::test]
async fn stub_domains_and_a_dead_upstream() {
    let up = upstream().await;
    // A stub domain to the upstream; everything else to a port nobody listens on.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dns = server(&format!(
        "example.com {{\n forward . {}\n}}\n. {{\n errors\n forward . {dead} {{\n  max_fails 1\n }}\n}}\n",
        up.addr
    ))
    .await;
    assert_eq!(
        ask(dns, "a.b.example.com.", RecordType::A).await.answers[0].to_string(),
        "a.b.example.com. 300 IN A 192.0.2.4"
    );
    let started = std::time::Instant::now();
    let m = ask(dns, "example.org.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(started.elapsed() < Duration::from_secs(3), "refused at once, not a 5 s wait: {:?}", started.elapsed());
}
