//! The L7 load balancer keeps its upstream connections and drains a withdrawn node: in a
//! namespace of the test's own, a site on 127.0.0.1:80 in front of an upstream that counts the
//! connections it accepts. Root only (a namespace; port 80).

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lb_sim::l7::{Site, Target};
use lb_sim::l7_proxy::Sites;
use testkit::netns::{root_or_explain, Netns};

/// One request with `Connection: close` (what curl -0 and many clients send).
fn get(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\nHost: web\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn upstream_connections_are_kept_across_client_connections_and_closed_when_the_node_is_withdrawn() {
    if !root_or_explain() {
        return;
    }
    let ns = Netns::new("l7pool");
    let upstream = ns.bind_tcp("127.0.0.1:0");
    let port = upstream.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = accepted.clone();
    ns.in_thread(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            // The upstream: HTTP/1.1 keep-alive, counting accepted connections.
            let listener = tokio::net::TcpListener::from_std(upstream).unwrap();
            let counter = seen.clone();
            tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    // Connections that carry proxied requests (the health checks' do not).
                    let counted = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let counter = counter.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                            if req.headers().contains_key("via") && !counted.swap(true, Ordering::SeqCst) {
                                counter.fetch_add(1, Ordering::SeqCst);
                            }
                            async move {
                                let conn =
                                    req.headers().get("connection").map(|v| v.to_str().unwrap_or("").to_string());
                                Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                                    bytes::Bytes::from(format!("ok {:?} connection={conn:?}\n", req.version())),
                                )))
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
            let site = Site {
                vip: "127.0.0.1".parse().unwrap(),
                ingress: "default/web".into(),
                rules: vec![],
                default: Some(Target { service: "default/web".into(), port: "80".into(), node_port: Some(port) }),
                tls: None,
            };
            let node: IpAddr = "127.0.0.1".parse().unwrap();
            let mut sites = Sites::default();
            assert!(sites.set(std::slice::from_ref(&site), &[node]).await.is_empty());
            for _ in 0..20 {
                let page = tokio::task::spawn_blocking(|| get("127.0.0.1:80")).await.unwrap();
                assert!(page.contains("ok HTTP/1.1 connection=None"), "{page}");
            }
            // Twenty client connections, one upstream connection, kept for the next client.
            assert_eq!(seen.load(Ordering::SeqCst), 1);
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(sites.idle_connections(&site.vip), Some(1));
            // A second node where the Service's NodePort answers nothing: its health check fails,
            // and requests keep going to the healthy backend only.
            let other: IpAddr = "127.0.0.2".parse().unwrap();
            assert!(sites.set(std::slice::from_ref(&site), &[node, other]).await.is_empty());
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let health = sites.backend_health(&site.vip).unwrap();
            assert_eq!(health[&format!("127.0.0.1:{port}")], "healthy", "{health:?}");
            assert_ne!(health[&format!("127.0.0.2:{port}")], "healthy", "{health:?}");
            for _ in 0..10 {
                let page = tokio::task::spawn_blocking(|| get("127.0.0.1:80")).await.unwrap();
                assert!(page.contains("ok HTTP/1.1"), "{page}");
            }
            assert_eq!(seen.load(Ordering::SeqCst), 1, "still the one kept connection");
            // Withdrawn: nothing new goes there and the kept connection is closed.
            assert!(sites.set(std::slice::from_ref(&site), &[]).await.is_empty());
            assert_eq!(sites.idle_connections(&site.vip), Some(0));
            let page = tokio::task::spawn_blocking(|| get("127.0.0.1:80")).await.unwrap();
            assert!(page.starts_with("HTTP/1.0 503") || page.starts_with("HTTP/1.1 503"), "{page}");
            sites.stop_all();
        });
    });
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}
