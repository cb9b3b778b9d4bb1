//! nodeport mode: a TCP load balancer on `LB IP:port` that connects to `node IP:nodePort` of
//! the nodes in rotation, round-robin, trying the next node when one does not accept (as cloud
//! LBs do). Changing the backends never touches connections already proxied; removing a
//! listener only stops new ones.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long one backend gets to accept.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Backends tried per connection.
pub const ATTEMPTS: usize = 3;

/// Counters of one listener.
#[derive(Debug, Default)]
pub struct Counters {
    pub accepted: AtomicU64,
    pub proxied: AtomicU64,
    pub failed: AtomicU64,
}

struct Listener {
    task: JoinHandle<()>,
    backends: Arc<RwLock<Vec<SocketAddr>>>,
    counters: Arc<Counters>,
}

/// The running listeners.
#[derive(Default)]
pub struct Proxies {
    listeners: BTreeMap<SocketAddr, Listener>,
}

impl Proxies {
    /// Makes the listeners match `wanted` (frontend → backends). A frontend that cannot be bound
    /// yet is reported and retried at the next call.
    pub async fn set(&mut self, wanted: &BTreeMap<SocketAddr, Vec<SocketAddr>>) -> Vec<String> {
        let mut errors = Vec::new();
        self.listeners.retain(|addr, l| {
            let keep = wanted.contains_key(addr);
            if !keep {
                l.task.abort();
                tracing::info!(frontend = %addr, "stopped NodePort proxy");
            }
            keep
        });
        for (addr, backends) in wanted {
            if let Some(l) = self.listeners.get(addr) {
                *l.backends.write().expect("backends lock") = backends.clone();
                continue;
            }
            match TcpListener::bind(addr).await {
                Ok(listener) => {
                    let shared = Arc::new(RwLock::new(backends.clone()));
                    let counters = Arc::new(Counters::default());
                    let task = tokio::spawn(serve(listener, shared.clone(), counters.clone()));
                    tracing::info!(frontend = %addr, ?backends, "NodePort proxy listening");
                    self.listeners.insert(*addr, Listener { task, backends: shared, counters });
                }
                Err(e) => errors.push(format!("cannot listen on {addr}: {e}")),
            }
        }
        errors
    }

    /// `(accepted, proxied, failed)` of a frontend.
    pub fn counters(&self, addr: &SocketAddr) -> Option<(u64, u64, u64)> {
        self.listeners.get(addr).map(|l| {
            let c = &l.counters;
            (c.accepted.load(Ordering::Relaxed), c.proxied.load(Ordering::Relaxed), c.failed.load(Ordering::Relaxed))
        })
    }

    /// The live counters of every listener.
    pub fn counter_handles(&self) -> BTreeMap<SocketAddr, Arc<Counters>> {
        self.listeners.iter().map(|(a, l)| (*a, l.counters.clone())).collect()
    }

    pub fn stop_all(&mut self) {
        for l in self.listeners.values() {
            l.task.abort();
        }
        self.listeners.clear();
    }
}

async fn serve(listener: TcpListener, backends: Arc<RwLock<Vec<SocketAddr>>>, counters: Arc<Counters>) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        let list = backends.read().expect("backends lock").clone();
        let start = next.fetch_add(1, Ordering::Relaxed);
        let counters = counters.clone();
        tokio::spawn(async move {
            match connect(&list, start, podpath_client::relay::inbound_tos(&client)).await {
                Some((mut upstream, to)) => {
                    counters.proxied.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, backend = %to, "proxying");
                    let mut client = client;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                None => {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, backends = list.len(), "no backend accepted the connection; closing it");
                }
            }
        });
    }
}

/// Tries up to [`ATTEMPTS`] backends, round-robin from `start`, keeping the client's TOS.
async fn connect(list: &[SocketAddr], start: usize, tos: u32) -> Option<(TcpStream, SocketAddr)> {
    for i in 0..list.len().min(ATTEMPTS) {
        let to = list[(start + i) % list.len()];
        match tokio::time::timeout(CONNECT_TIMEOUT, podpath_client::relay::connect_with_tos(to, tos)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Some((s, to));
            }
            Ok(Err(e)) => tracing::info!(backend = %to, error = %e, "backend refused; trying the next node"),
            Err(_) => tracing::info!(backend = %to, "backend did not answer; trying the next node"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn backend(tag: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                s.write_all(tag.as_bytes()).await.unwrap();
            }
        });
        a
    }

    async fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn round_robin_skips_a_dead_backend_and_follows_changes() {
        let a = backend("a").await;
        let b = backend("b").await;
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let mut p = Proxies::default();
        let errors = p.set(&[(front, vec![a, dead, b])].into()).await;
        assert!(errors.is_empty(), "{errors:?}");
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(get(front).await);
        }
        assert!(seen.contains(&"a".to_string()) && seen.contains(&"b".to_string()), "{seen:?}");
        assert_eq!(p.counters(&front), Some((6, 6, 0)));
        p.set(&[(front, vec![b])].into()).await;
        assert_eq!(get(front).await, "b");
        p.set(&[(front, vec![])].into()).await;
        assert_eq!(get(front).await, "", "no backend: the connection is closed");
        p.set(&BTreeMap::new()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(front).await.is_err(), "listener stopped");
    }
}
