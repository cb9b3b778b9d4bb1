//! Cloud-LB-style health checks: `GET` every check target every [`INTERVAL`]; a backend is
//! withdrawn after [`FALL`] failures in a row and comes back after [`RISE`] successes (the
//! first result counts at once). With a 500 ms interval and a 400 ms timeout a dead node is
//! out of rotation within about 1.4 s.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podpath_client::http;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::Check;

pub const INTERVAL: Duration = Duration::from_millis(500);
pub const TIMEOUT: Duration = Duration::from_millis(400);
pub const FALL: u32 = 2;
pub const RISE: u32 = 2;

/// One target's health, as the check results say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthState {
    pub healthy: bool,
    /// False until the first result.
    pub checked: bool,
    /// Results in a row that disagree with `healthy`.
    streak: u32,
    pub last_error: Option<String>,
}

impl HealthState {
    /// Takes one result; returns whether `healthy` changed. Pure.
    pub fn observe(&mut self, result: Result<(), String>) -> bool {
        let ok = result.is_ok();
        self.last_error = result.err();
        if !self.checked {
            self.checked = true;
            self.healthy = ok;
            return ok;
        }
        if ok == self.healthy {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        if self.streak >= if ok { RISE } else { FALL } {
            self.healthy = ok;
            self.streak = 0;
            return true;
        }
        false
    }
}

/// One `GET` of the check's path; `Ok` on a 200 within `timeout`.
pub async fn probe(check: &Check, timeout: Duration) -> Result<(), String> {
    let addr = std::net::SocketAddr::new(check.ip, check.port);
    let headers = [("User-Agent", "podpath-lb-sim")];
    let req = http::Request { headers: &headers, ..http::Request::get(&check.path) };
    match http::request(addr, &req, timeout).await {
        Ok(r) if r.status == 200 => Ok(()),
        Ok(r) => Err(format!("HTTP {}", r.status)),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs one checker task per target and keeps their states; `changes` ticks whenever a
/// target's health flips.
pub struct Checker {
    states: Arc<Mutex<BTreeMap<Check, HealthState>>>,
    tasks: Mutex<HashMap<Check, JoinHandle<()>>>,
    changes: Arc<watch::Sender<u64>>,
    interval: Duration,
    timeout: Duration,
}

impl Checker {
    pub fn new(interval: Duration, timeout: Duration) -> Checker {
        Checker {
            states: Arc::default(),
            tasks: Mutex::default(),
            changes: Arc::new(watch::channel(0).0),
            interval,
            timeout,
        }
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Starts checking new targets and stops (and forgets) the ones no longer wanted.
    pub fn set_targets<'a>(&self, wanted: impl IntoIterator<Item = &'a Check>) {
        let wanted: std::collections::BTreeSet<&Check> = wanted.into_iter().collect();
        let mut tasks = self.tasks.lock().expect("checker lock");
        tasks.retain(|c, t| {
            let keep = wanted.contains(c);
            if !keep {
                t.abort();
                self.states.lock().expect("checker lock").remove(c);
            }
            keep
        });
        for c in wanted {
            if tasks.contains_key(c) {
                continue;
            }
            let (check, states, changes, interval, timeout) =
                (c.clone(), self.states.clone(), self.changes.clone(), self.interval, self.timeout);
            states.lock().expect("checker lock").insert(check.clone(), HealthState::default());
            tasks.insert(
                c.clone(),
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(interval);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        let result = probe(&check, timeout).await;
                        let flipped = {
                            let mut all = states.lock().expect("checker lock");
                            let Some(s) = all.get_mut(&check) else { return };
                            s.observe(result.clone())
                        };
                        if flipped {
                            match &result {
                                Ok(()) => tracing::info!(check = %check, "backend healthy"),
                                Err(e) => tracing::warn!(check = %check, error = %e, "backend unhealthy; withdrawn"),
                            }
                        }
                        if flipped {
                            changes.send_modify(|g| *g += 1);
                        }
                    }
                }),
            );
        }
    }

    pub fn healthy(&self, c: &Check) -> bool {
        self.states.lock().expect("checker lock").get(c).is_some_and(|s| s.healthy)
    }

    pub fn snapshot(&self) -> BTreeMap<Check, HealthState> {
        self.states.lock().expect("checker lock").clone()
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        for t in self.tasks.lock().expect("checker lock").values() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_first_result_counts_then_fall_and_rise_thresholds_apply() {
        let mut s = HealthState::default();
        assert!(s.observe(Ok(())));
        assert!(s.healthy);
        assert!(!s.observe(Err("refused".into())), "one failure is not enough");
        assert!(s.healthy);
        assert!(!s.observe(Ok(())), "a success resets the streak");
        assert!(!s.observe(Err("refused".into())));
        assert!(s.observe(Err("refused".into())));
        assert!(!s.healthy);
        assert_eq!(s.last_error.as_deref(), Some("refused"));
        assert!(!s.observe(Ok(())));
        assert!(s.observe(Ok(())));
        assert!(s.healthy && s.last_error.is_none());
    }

    #[test]
    fn a_first_failure_is_unhealthy_at_once() {
        let mut s = HealthState::default();
        assert!(!s.observe(Err("HTTP 503".into())));
        assert!(s.checked && !s.healthy);
    }

    #[tokio::test]
    async fn probe_reads_the_status_code() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            for answer in ["HTTP/1.1 200 OK\r\n\r\n", "HTTP/1.1 503 Service Unavailable\r\n\r\n", ""] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                if answer.is_empty() {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                } else {
                    s.write_all(answer.as_bytes()).await.unwrap();
                }
            }
        });
        let c = Check { ip: addr.ip(), port: addr.port(), path: "/healthz".into() };
        assert_eq!(probe(&c, TIMEOUT).await, Ok(()));
        assert_eq!(probe(&c, TIMEOUT).await, Err("HTTP 503".into()));
        assert!(probe(&c, Duration::from_millis(100)).await.unwrap_err().contains("no answer"));
    }
}
