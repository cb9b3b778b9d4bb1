//! The horizontal pod autoscaler (kube-controller-manager's): every few seconds each
//! HorizontalPodAutoscaler's target is scaled by the ratio of its pods' CPU use (from
//! metrics.k8s.io, [`crate::resource_metrics`]) to the target utilization of their CPU requests
//! — within a tolerance of 10 %, between `minReplicas` and `maxReplicas`, at most doubling (or +4)
//! per step, and down only to the highest recommendation of the scale-down stabilization
//! window (300 s unless `behavior` says otherwise). Status, conditions and Events as the real
//! controller writes them. The decision ([`decide`]) is pure.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use api::kinds::horizontalpodautoscaler::{cpu_target, HorizontalPodAutoscaler};
use api::Codec;
use api::Kind;
use serde_json::{json, Value};

use crate::controllers::events::{self, EventType, Report};
use crate::error::ApiError;
use crate::registry::{Registry, Subresource, WriteOptions};

/// How often each HPA is evaluated (the real controller: 15 s; here with the metrics' 5 s).
pub const PERIOD_SECONDS: i64 = 5;
const TOLERANCE: f64 = 0.1;
const COMPONENT: &str = "horizontal-pod-autoscaler";

/// What the controller measured for one HPA.
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    /// (utilization % of requests, average millicores per pod, pods measured).
    Cpu(i64, i64, i64),
    /// Why there is no figure (the condition's message).
    Failed(String),
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub desired: i32,
    /// (type, status, reason, message)
    pub conditions: Vec<(&'static str, &'static str, &'static str, String)>,
    /// The reason of a rescale, for its Event.
    pub reason: Option<String>,
}

/// Decides the replica count (pure). `history`: recent recommendations (unix seconds, count),
/// for the scale-down stabilization window.
pub fn decide(
    hpa: &HorizontalPodAutoscaler,
    current: i32,
    measure: &Measure,
    history: &[(i64, i32)],
    now: i64,
) -> Decision {
    let spec = hpa.spec.clone().unwrap_or_default();
    let (min, max) = (spec.min_replicas.unwrap_or(1), spec.max_replicas);
    let target = cpu_target(hpa).unwrap_or(api::kinds::horizontalpodautoscaler::DEFAULT_CPU_UTILIZATION);
    if current == 0 && min != 0 {
        return Decision {
            desired: 0,
            conditions: vec![
                (
                    "AbleToScale",
                    "True",
                    "SucceededGetScale",
                    "the HPA controller was able to get the target's current scale".into(),
                ),
                (
                    "ScalingActive",
                    "False",
                    "ScalingDisabled",
                    "scaling is disabled since the replica count of the target is zero".into(),
                ),
            ],
            reason: None,
        };
    }
    let (util, pods) = match measure {
        Measure::Cpu(u, _, n) => (*u, *n),
        Measure::Failed(msg) => {
            return Decision {
                desired: current,
                conditions: vec![
                    (
                        "AbleToScale",
                        "True",
                        "SucceededGetScale",
                        "the HPA controller was able to get the target's current scale".into(),
                    ),
                    ("ScalingActive", "False", "FailedGetResourceMetric", msg.clone()),
                ],
                reason: None,
            }
        }
    };
    let ratio = util as f64 / target.max(1) as f64;
    let mut proposal = if (ratio - 1.0).abs() <= TOLERANCE { current } else { (ratio * pods as f64).ceil() as i32 };
    // Scale-down stabilization: the highest recommendation of the window.
    let window = spec
        .behavior
        .as_ref()
        .and_then(|b| b.scale_down.as_ref())
        .and_then(|d| d.stabilization_window_seconds)
        .unwrap_or(300) as i64;
    let stabilized =
        history.iter().filter(|(t, _)| now - t < window).map(|(_, r)| *r).chain([proposal]).max().unwrap_or(proposal);
    if proposal < current {
        proposal = stabilized.min(current);
    }
    // Scale-up limit: at most double, or four more (the default policies, per period).
    let up_limit = (current * 2).max(current + 4);
    let mut limited = None;
    let mut desired = proposal.min(up_limit);
    if desired > max {
        desired = max;
        limited = Some(("TooManyReplicas", "the desired replica count is more than the maximum replica count"));
    } else if desired < min {
        desired = min;
        limited = Some(("TooFewReplicas", "the desired replica count is less than the minimum replica count"));
    }
    let able = if desired != current {
        (
            "AbleToScale",
            "True",
            "SucceededRescale",
            format!("the HPA controller was able to update the target scale to {desired}"),
        )
    } else {
        ("AbleToScale", "True", "ReadyForNewScale", "recommended size matches current size".into())
    };
    let active = (
        "ScalingActive",
        "True",
        "ValidMetricFound",
        "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)"
            .to_string(),
    );
    let limit = match limited {
        Some((reason, msg)) => ("ScalingLimited", "True", reason, msg.to_string()),
        None => {
            ("ScalingLimited", "False", "DesiredWithinRange", "the desired count is within the acceptable range".into())
        }
    };
    let reason = (desired != current).then(|| {
        let dir = if desired > current { "above" } else { "below" };
        format!("cpu resource utilization (percentage of request) {dir} target")
    });
    Decision { desired, conditions: vec![able, active, limit], reason }
}

/// Recent recommendations per HPA (`namespace/name`), kept in memory as the real controller does.
#[derive(Default)]
pub struct History(Mutex<HashMap<String, VecDeque<(i64, i32)>>>);

/// The pods the target's selector picks, and the selector's text.
fn target_pods(reg: &Registry, ns: &str, target: &Value) -> Result<Vec<Value>, ApiError> {
    let sel: Option<api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> =
        match target.pointer("/spec/selector") {
            // A ReplicationController's selector is a plain map.
            Some(Value::Object(m)) if !m.contains_key("matchLabels") && !m.contains_key("matchExpressions") => {
                api::Codec::from_json(json!({"matchLabels": m})).ok()
            }
            Some(s) => api::Codec::from_json(s.clone()).ok(),
            None => None,
        };
    let Some(sel) = sel else { return Ok(vec![]) };
    let (pods, _) = reg.store.list(Kind::Pod, Some(ns))?;
    Ok(pods
        .into_iter()
        .filter(|p| {
            let labels: Option<BTreeMap<String, String>> =
                p.pointer("/metadata/labels").and_then(|l| serde_json::from_value(l.clone()).ok());
            api::apps::selector_matches(&sel, labels.as_ref())
                && p.pointer("/metadata/deletionTimestamp").is_none()
                && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        })
        .collect())
}

/// The pods' CPU use against their requests.
fn measure(reg: &Registry, ns: &str, pods: &[Value]) -> Measure {
    let (mut used_m, mut requested_m, mut n) = (0i64, 0i64, 0i64);
    for p in pods {
        let name = p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        for c in p.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
            if c.pointer("/resources/requests/cpu").is_none() {
                let cname = c["name"].as_str().unwrap_or("");
                return Measure::Failed(format!(
                    "failed to get cpu utilization: missing request for cpu in container {cname:?} of Pod {name:?}"
                ));
            }
        }
        let Some(usage) = reg.metrics.pod(ns, name) else { continue };
        let req = api::quantity::pod_requests(p).get("cpu").copied().unwrap_or(0) as i64;
        used_m += (usage.cpu_nanocores() / 1_000_000) as i64;
        requested_m += req;
        n += 1;
    }
    if n == 0 || requested_m == 0 {
        return Measure::Failed(
            "failed to get cpu utilization: unable to get metrics for resource cpu: no metrics returned from resource metrics API"
                .into(),
        );
    }
    Measure::Cpu(used_m * 100 / requested_m, used_m / n, n)
}

fn kind_of(api_version: &str, kind: &str) -> Option<Kind> {
    match (api_version, kind) {
        ("apps/v1", "Deployment") => Some(Kind::Deployment),
        ("apps/v1", "ReplicaSet") => Some(Kind::ReplicaSet),
        ("apps/v1", "StatefulSet") => Some(Kind::StatefulSet),
        ("v1", "ReplicationController") => Some(Kind::ReplicationController),
        _ => None,
    }
}

/// Evaluates every HPA whose period is due.
pub async fn sync(reg: &Registry, history: &History) -> Result<(), ApiError> {
    let (hpas, _) = reg.store.list(Kind::HorizontalPodAutoscaler, None)?;
    let now = jiff::Timestamp::now().as_second();
    for obj in hpas {
        let Ok(hpa) = HorizontalPodAutoscaler::from_json(obj.clone()) else { continue };
        let ns = hpa.metadata.namespace.clone().unwrap_or_default();
        let name = hpa.metadata.name.clone().unwrap_or_default();
        let spec = hpa.spec.clone().unwrap_or_default();
        let target_ref = &spec.scale_target_ref;
        let key = format!("{ns}/{name}");
        let Some(kind) = kind_of(target_ref.api_version.as_deref().unwrap_or(""), &target_ref.kind) else {
            let msg = format!(
                "the HPA controller was unable to get the target's current scale: no matches for kind {:?}",
                target_ref.kind
            );
            write_status(reg, &obj, None, 0, &[("AbleToScale", "False", "FailedGetScale", msg)], None).await?;
            continue;
        };
        let Some(target) = reg.store.get(kind, &ns, &target_ref.name)? else {
            let msg = format!(
                "the HPA controller was unable to get the target's current scale: {} {:?} not found",
                kind.qualified_resource(),
                target_ref.name
            );
            write_status(reg, &obj, None, 0, &[("AbleToScale", "False", "FailedGetScale", msg)], None).await?;
            continue;
        };
        let current = target.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1) as i32;
        let pods = target_pods(reg, &ns, &target)?;
        let m = measure(reg, &ns, &pods);
        let past: Vec<(i64, i32)> = history
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .map(|d| d.iter().copied().collect())
            .unwrap_or_default();
        let d = decide(&hpa, current, &m, &past, now);
        if let Measure::Cpu(..) = m {
            let mut h = history.0.lock().unwrap_or_else(|e| e.into_inner());
            let q = h.entry(key.clone()).or_default();
            q.push_back((now, d.desired));
            while q.front().is_some_and(|(t, _)| now - t > 3600) || q.len() > 1000 {
                q.pop_front();
            }
        }
        let mut scaled_at = None;
        if d.desired != current && d.reason.is_some() {
            let want = d.desired;
            reg.update_scale(
                kind,
                &ns,
                &target_ref.name,
                |s| {
                    let mut s = s.clone();
                    s["spec"]["replicas"] = json!(want);
                    Ok(s)
                },
                &WriteOptions::default(),
            )
            .await?;
            scaled_at = Some(now);
            events::record(
                reg,
                Report {
                    component: COMPONENT,
                    host: None,
                    object: &obj,
                    kind: Kind::HorizontalPodAutoscaler,
                    field_path: None,
                    type_: EventType::Normal,
                    reason: "SuccessfulRescale",
                    message: format!("New size: {want}; reason: {}", d.reason.clone().unwrap_or_default()),
                },
            )
            .await;
        }
        let conds: Vec<(&str, &str, &str, String)> = d.conditions.clone();
        write_status(reg, &obj, Some(&m), current, &conds, scaled_at.map(|_| d.desired)).await?;
    }
    Ok(())
}

/// Writes the status when it changed (conditions keep their transition time while their status holds).
async fn write_status(
    reg: &Registry,
    obj: &Value,
    m: Option<&Measure>,
    current: i32,
    conditions: &[(&str, &str, &str, String)],
    scaled_to: Option<i32>,
) -> Result<(), ApiError> {
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap_or_default().to_string();
    let old = obj.get("status").cloned().unwrap_or(json!({}));
    let mut status = old.clone();
    let map = status.as_object_mut().expect("a status object");
    map.insert("currentReplicas".into(), json!(current));
    map.insert("desiredReplicas".into(), json!(scaled_to.unwrap_or(current)));
    if let Some(g) = obj.pointer("/metadata/generation") {
        map.insert("observedGeneration".into(), g.clone());
    }
    match m {
        Some(Measure::Cpu(util, avg, _)) => {
            map.insert(
                "currentMetrics".into(),
                json!([{"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": util, "averageValue": format!("{avg}m")}}}]),
            );
        }
        _ => {
            map.remove("currentMetrics");
        }
    }
    if scaled_to.is_some() {
        map.insert("lastScaleTime".into(), json!(now));
    }
    let before: Vec<Value> = old.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let conds: Vec<Value> = conditions
        .iter()
        .map(|(t, s, r, msg)| {
            let since = before
                .iter()
                .find(|c| c["type"] == *t && c["status"] == *s)
                .and_then(|c| c.get("lastTransitionTime").cloned())
                .unwrap_or(json!(now));
            json!({"type": t, "status": s, "reason": r, "message": msg, "lastTransitionTime": since})
        })
        .collect();
    map.insert("conditions".into(), json!(conds));
    if status == old {
        return Ok(());
    }
    let mut new = obj.clone();
    new["status"] = status;
    let (ns, name) = (
        obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string(),
        obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string(),
    );
    match reg
        .update(Kind::HorizontalPodAutoscaler, Some(&ns), &name, new, Subresource::Status, &WriteOptions::default())
        .await
    {
        Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(min: i32, max: i32, target: i32, down_window: Option<i32>) -> HorizontalPodAutoscaler {
        let mut v = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": min, "maxReplicas": max,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": target}}}]}});
        if let Some(w) = down_window {
            v["spec"]["behavior"] = json!({"scaleDown": {"stabilizationWindowSeconds": w}});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn scales_by_the_ratio_within_the_tolerance_and_the_bounds() {
        let h = hpa(1, 10, 50, None);
        // 250 % of requests on 1 pod at a 50 % target: 5 pods.
        let d = decide(&h, 1, &Measure::Cpu(250, 250, 1), &[], 0);
        assert_eq!(
            (d.desired, d.reason.as_deref()),
            (5, Some("cpu resource utilization (percentage of request) above target"))
        );
        assert_eq!(d.conditions[0].2, "SucceededRescale");
        // Within 10 %: no change.
        assert_eq!(decide(&h, 4, &Measure::Cpu(54, 54, 4), &[], 0).desired, 4);
        // At most double (or +4) per step, and never over max.
        assert_eq!(decide(&h, 2, &Measure::Cpu(1000, 1000, 2), &[], 0).desired, 6);
        let capped = decide(&hpa(1, 3, 50, None), 2, &Measure::Cpu(1000, 1000, 2), &[], 0);
        assert_eq!((capped.desired, capped.conditions[2].2), (3, "TooManyReplicas"));
    }

    #[test]
    fn scale_down_waits_for_the_stabilization_window() {
        let h = hpa(1, 10, 50, None);
        // Idle now, but 4 was recommended 100 s ago: stay at 4.
        let d = decide(&h, 4, &Measure::Cpu(0, 0, 4), &[(100, 4)], 200);
        assert_eq!(d.desired, 4);
        // After the window (300 s): down to the minimum.
        let d = decide(&h, 4, &Measure::Cpu(0, 0, 4), &[(100, 4)], 401);
        assert_eq!(
            (d.desired, d.reason.as_deref()),
            (1, Some("cpu resource utilization (percentage of request) below target"))
        );
        // A window of 0 (behavior): at once.
        assert_eq!(decide(&hpa(1, 10, 50, Some(0)), 4, &Measure::Cpu(0, 0, 4), &[(399, 4)], 400).desired, 1);
    }

    #[test]
    fn no_metrics_or_a_zero_target_say_why() {
        let h = hpa(1, 10, 50, None);
        let d = decide(&h, 2, &Measure::Failed("failed to get cpu utilization: x".into()), &[], 0);
        assert_eq!((d.desired, d.conditions[1].1, d.conditions[1].2), (2, "False", "FailedGetResourceMetric"));
        let d = decide(&h, 0, &Measure::Cpu(100, 100, 1), &[], 0);
        assert_eq!((d.desired, d.conditions[1].2), (0, "ScalingDisabled"));
    }
}
