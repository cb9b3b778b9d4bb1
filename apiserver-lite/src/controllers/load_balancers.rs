//! LoadBalancer Services that are still pending (the pool was full when they were written) get
//! an address as soon as one frees up, oldest first, as a cloud controller's queue serves them.
//! The address itself is allocated by the Service's own admission (`ApiObject::allocate`): the
//! controller only writes each pending Service again, in order, until one stays pending.

use api::Kind;
use serde_json::Value;

use super::write::ns_name;
use crate::error::ApiError;
use crate::registry::{Registry, Subresource, WriteOptions};

/// Whether a Service waits for a load-balancer address from the pool.
fn is_pending(svc: &Value) -> bool {
    let spec = &svc["spec"];
    spec["type"] == "LoadBalancer"
        && spec["loadBalancerClass"].is_null()
        && svc["metadata"]["deletionTimestamp"].is_null()
        && svc["status"]["loadBalancer"]["ingress"].as_array().is_none_or(|i| i.is_empty())
}

/// The pending LoadBalancer Services, oldest first (creation time, then namespace and name).
pub fn pending_load_balancers(services: &[Value]) -> Vec<(String, String)> {
    let mut pending: Vec<(String, String, String)> = services
        .iter()
        .filter(|s| is_pending(s))
        .map(|s| {
            let (ns, name) = ns_name(s);
            (s["metadata"]["creationTimestamp"].as_str().unwrap_or("").to_string(), ns, name)
        })
        .collect();
    pending.sort();
    pending.into_iter().map(|(_, ns, name)| (ns, name)).collect()
}

/// Writes the pending Services again, oldest first, until one stays pending (the pool is full
/// again). One that asked for an address it cannot have is skipped.
pub async fn retry_pending(reg: &Registry) -> Result<(), ApiError> {
    let (services, _) = reg.store.list(Kind::Service, None)?;
    for (ns, name) in pending_load_balancers(&services) {
        let Some(current) = reg.store.get(Kind::Service, &ns, &name)? else { continue };
        match reg.update(Kind::Service, Some(&ns), &name, current, Subresource::Main, &WriteOptions::default()).await {
            Ok(out) if is_pending(&out.object) => break,
            Ok(_) => tracing::info!(service = %format!("{ns}/{name}"), "pending load balancer got an address"),
            Err(ApiError::Invalid { .. }) | Err(ApiError::NotFound { .. }) | Err(ApiError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(name: &str, created: &str, ty: &str, ip: Option<&str>) -> Value {
        let ingress = ip.map(|ip| json!([{"ip": ip}])).unwrap_or(json!(null));
        json!({"metadata": {"namespace": "default", "name": name, "creationTimestamp": created},
               "spec": {"type": ty}, "status": {"loadBalancer": {"ingress": ingress}}})
    }

    #[test]
    fn pending_services_are_served_oldest_first() {
        let services = [
            svc("late", "2026-11-24T10:00:02Z", "LoadBalancer", None),
            svc("served", "2026-11-24T10:00:00Z", "LoadBalancer", Some("198.51.100.1")),
            svc("early", "2026-11-24T10:00:01Z", "LoadBalancer", None),
            svc("plain", "2026-11-24T09:00:00Z", "ClusterIP", None),
        ];
        let mut classed = svc("classed", "2026-11-24T08:00:00Z", "LoadBalancer", None);
        classed["spec"]["loadBalancerClass"] = json!("example.com/other");
        let mut all = services.to_vec();
        all.push(classed);
        assert_eq!(
            pending_load_balancers(&all),
            [("default".to_string(), "early".to_string()), ("default".to_string(), "late".to_string())]
        );
    }
}
