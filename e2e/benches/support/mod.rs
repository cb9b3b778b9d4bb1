//! What the lab benchmarks share: the lab's API access and waiting for pods to be Ready.
//! Included by each bench with `#[path = "support/mod.rs"] mod support;`.

use std::time::Duration;

use podpath_e2e::{wait_for, Lab};
use podpath_lab::state::ApiAccess;

/// The lab's REST access (its CA and token).
pub fn api(lab: &Lab) -> ApiAccess {
    let st = podpath_lab::state::load_state(&lab.state).expect("lab state").expect("a lab");
    ApiAccess::of(&st).expect("the lab's API access")
}

/// Waits until `n` pods of `default` are Ready (at most `limit`).
pub fn wait_ready(a: &ApiAccess, n: usize, limit: Duration) {
    wait_for(limit, "pods Ready", || {
        let (_, body) = a.request("GET", "/api/v1/namespaces/default/pods", "").map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let ready = v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|p| {
                        p["status"]["conditions"]
                            .as_array()
                            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                    })
                    .count()
            })
            .unwrap_or(0);
        if ready >= n {
            Ok(())
        } else {
            Err(format!("{ready}/{n} ready"))
        }
    });
}
