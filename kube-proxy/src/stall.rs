//! A stalled service proxy, on purpose (the lab's `podpath fault stall proxy NODE`): while the
//! file `faults/stall-proxy` of the agent's state directory holds a time in the future (Unix
//! seconds) or the word `forever`, the proxier loops stop before their next sync, as a
//! kube-proxy that hangs does. The node keeps running: pods, heartbeats, and the rules already
//! in the kernel stay; Service changes wait, and the proxy's `/healthz` turns unhealthy once
//! changes are queued longer than its timeout. The file is read once per loop turn and every
//! 200 ms while stalled; it is the whole control, so a lab can set and clear it without a port.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The control file, set once by the agent (tests and benches leave it unset: never stalled).
static FILE: OnceLock<PathBuf> = OnceLock::new();

/// The control file of an agent whose state directory is `state_dir`.
pub fn file_in(state_dir: &Path) -> PathBuf {
    state_dir.join("faults").join("stall-proxy")
}

/// Makes this process's proxier loops obey `state_dir`'s control file.
pub fn watch(state_dir: &Path) {
    let _ = FILE.set(file_in(state_dir));
}

/// Whether the control file's content stalls the proxy at `now` (pure).
pub fn stalls(content: &str, now: SystemTime) -> bool {
    let c = content.trim();
    if c == "forever" {
        return true;
    }
    match c.parse::<f64>() {
        Ok(until) if until.is_finite() && until > 0.0 => {
            now.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() < until).unwrap_or(false)
        }
        _ => false,
    }
}

fn stalled_now() -> bool {
    FILE.get().and_then(|f| std::fs::read_to_string(f).ok()).is_some_and(|c| stalls(&c, SystemTime::now()))
}

/// Returns at once unless the proxy is stalled; else waits until it is not.
pub async fn hold() {
    if !stalled_now() {
        return;
    }
    tracing::warn!("service proxy stalled (fault injected by the lab): no sync until it is cleared");
    let started = std::time::Instant::now();
    while stalled_now() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(stalled_ms = started.elapsed().as_millis() as u64, "service proxy resumed");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_in_the_future_or_forever_stalls_anything_else_does_not() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        assert!(stalls("1000.5\n", now));
        assert!(stalls("forever", now));
        assert!(!stalls("999", now));
        assert!(!stalls("", now));
        assert!(!stalls("soon", now));
        assert!(!stalls("NaN", now));
    }
}
