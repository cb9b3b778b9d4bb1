//! The DNS server in process, over real UDP and TCP sockets on loopback: answers, negative
//! answers, refusals, and truncation to the client's buffer with the full answer over TCP.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use podpath_dns::records::{Config, Zone};
use podpath_dns::server::{Handler, SharedZone};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn zone(endpoints: usize) -> Zone {
    let services = vec![
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 80}]}}))
        .unwrap(),
        serde_json::from_value(json!({"metadata": {"name": "many", "namespace": "default"},
            "spec": {"clusterIP": "None"}}))
        .unwrap(),
    ];
    let eps: Vec<_> =
        (0..endpoints).map(|i| json!({"addresses": [format!("10.244.{}.{}", i / 200, i % 200 + 2)]})).collect();
    let slices = vec![serde_json::from_value(json!({
        "metadata": {"name": "many-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "many"}},
        "addressType": "IPv4", "endpoints": eps}))
    .unwrap()];
    Zone::build(Config::new("cluster.local", 30).unwrap(), &services, &slices, 1)
}

async fn server(z: Zone) -> (SocketAddr, SocketAddr, SharedZone) {
    let shared = SharedZone::new(z);
    let mut s = hickory_server::Server::new(Handler::builtin(shared.clone(), Default::default()));
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (u, t) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
    s.register_socket(udp);
    s.register_listener(tcp, Duration::from_secs(5), 64 << 10);
    tokio::spawn(async move {
        let _ = s.block_until_done().await;
    });
    (u, t, shared)
}

fn query(name: &str, t: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = 4242;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.to_vec().unwrap()
}

async fn udp(addr: SocketAddr, q: &[u8]) -> Message {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(q, addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(5), s.recv(&mut buf)).await.expect("an answer").unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

async fn tcp(addr: SocketAddr, q: &[u8]) -> Message {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
    s.write_all(q).await.unwrap();
    let len = s.read_u16().await.unwrap() as usize;
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

#[tokio::test]
async fn answers_negative_answers_and_refusals_over_udp_and_tcp() {
    let (u, t, _) = server(zone(3)).await;
    let a = udp(u, &query("web.default.svc.cluster.local.", RecordType::A)).await;
    assert_eq!(a.metadata.id, 4242);
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert!(a.metadata.authoritative && !a.metadata.recursion_available);
    assert_eq!(a.answers.len(), 1);
    assert_eq!(a.answers[0].to_string(), "web.default.svc.cluster.local. 30 IN A 10.96.0.20");
    let t_a = tcp(t, &query("web.default.svc.cluster.local.", RecordType::A)).await;
    assert_eq!(t_a.answers, a.answers);
    let nx = udp(u, &query("nope.default.svc.cluster.local.", RecordType::A)).await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(nx.authorities.len(), 1, "the SOA, for negative caching");
    let refused = udp(u, &query("example.com.", RecordType::A)).await;
    assert_eq!(refused.metadata.response_code, ResponseCode::Refused);
}

#[tokio::test]
async fn a_large_answer_is_truncated_over_udp_and_whole_over_tcp() {
    let (u, t, shared) = server(zone(300)).await;
    let q = query("many.default.svc.cluster.local.", RecordType::A);
    let small = udp(u, &q).await;
    assert!(small.metadata.truncation, "300 addresses do not fit 512 bytes");
    assert!(small.answers.len() < 300);
    let whole = tcp(t, &q).await;
    assert!(!whole.metadata.truncation);
    assert_eq!(whole.answers.len(), 300);
    // A new zone is served from the next query on.
    shared.set(zone(2));
    assert_eq!(udp(u, &q).await.answers.len(), 2);
}

#[tokio::test]
async fn other_classes_oversized_and_truncated_messages_and_a_flood() {
    let (u, t, _) = server(zone(1)).await;
    // CHAOS class (version.bind): not the cluster's.
    let mut m = Message::query();
    m.metadata.id = 1;
    let mut q = Query::query(Name::from_ascii("version.bind.").unwrap(), RecordType::TXT);
    q.set_query_class(hickory_proto::rr::DNSClass::CH);
    m.add_query(q);
    assert_eq!(udp(u, &m.to_vec().unwrap()).await.metadata.response_code, ResponseCode::Refused);
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // A datagram of 4 KiB of zeros and one cut in the middle of its question.
    s.send_to(&[0u8; 4096], u).await.unwrap();
    let whole = query("web.default.svc.cluster.local.", RecordType::A);
    s.send_to(&whole[..whole.len() - 3], u).await.unwrap();
    // Over TCP: a length prefix promising more than ever comes, then the connection closes.
    let mut c = tokio::net::TcpStream::connect(t).await.unwrap();
    c.write_all(&[0xff, 0xff, 1, 2, 3]).await.unwrap();
    drop(c);
    // A flood from one client (bounded: 20,000 datagrams, sent as fast as the socket takes
    // them) does not stop another client's answers.
    let flood = tokio::spawn(async move {
        let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for _ in 0..20_000 {
            let _ = s.send_to(&whole, u).await;
        }
    });
    // UDP may drop a datagram when the socket's buffer is full: like a resolver, retry after
    // a second (at most 5 times).
    for _ in 0..20 {
        let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let q = query("web.default.svc.cluster.local.", RecordType::A);
        let mut buf = vec![0u8; 4096];
        let mut answered = None;
        for _ in 0..5 {
            s.send_to(&q, u).await.unwrap();
            if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), s.recv(&mut buf)).await {
                answered = Some(Message::from_vec(&buf[..n]).unwrap());
                break;
            }
        }
        assert_eq!(answered.expect("answered during the flood").answers.len(), 1);
    }
    flood.await.unwrap();
    assert_eq!(udp(u, &query("web.default.svc.cluster.local.", RecordType::A)).await.answers.len(), 1);
}

#[tokio::test]
async fn garbage_does_not_stop_the_server() {
    let (u, _, _) = server(zone(1)).await;
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(b"\x01\x02garbage", u).await.unwrap();
    let a = udp(u, &query("web.default.svc.cluster.local.", RecordType::A)).await;
    assert_eq!(a.answers.len(), 1);
}
