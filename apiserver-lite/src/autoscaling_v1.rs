//! `autoscaling/v1` HorizontalPodAutoscalers: the stored autoscaling/v2 objects seen through the
//! older version, as the real server serves both (`kubectl autoscale` creates v1). v1 knows one
//! metric, `targetCPUUtilizationPercentage`, which is v2's Resource metric on `cpu` with a
//! Utilization target; its status has `currentCPUUtilizationPercentage`. Pure conversions, used
//! by the request and response plumbing of [`crate::events_v1`].

use api::KindInfo;
use serde_json::{json, Value};

use crate::events_v1::Conversion;

pub const GROUP: &str = "autoscaling";
pub const VERSION: &str = "v1";
const PREFIX: &str = "/apis/autoscaling/v1";

/// How discovery and OpenAPI describe the resource in this version.
pub static INFO: KindInfo = KindInfo {
    group: GROUP,
    version: VERSION,
    short_names: &["hpa"],
    categories: &["all"],
    has_status: true,
    ..KindInfo::core("HorizontalPodAutoscaler", "horizontalpodautoscalers", "horizontalpodautoscaler")
};

pub static HPA: Conversion = Conversion {
    to_storage: to_v2,
    json_patch: json_patch_to_v2,
    field_selector: |s| s.to_string(),
    validate_create: |_| None,
    to_served: to_v1,
    protobuf: Some("autoscaling.v1.HorizontalPodAutoscaler"),
};

/// The autoscaling/v2 path for an autoscaling/v1 HorizontalPodAutoscaler path.
pub fn v2_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix(PREFIX)?;
    let segs: Vec<&str> = rest.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let ok = matches!(
        segs.as_slice(),
        ["horizontalpodautoscalers"]
            | ["namespaces", _, "horizontalpodautoscalers"]
            | ["namespaces", _, "horizontalpodautoscalers", _]
            | ["namespaces", _, "horizontalpodautoscalers", _, "status"]
    );
    ok.then(|| format!("/apis/autoscaling/v2{rest}"))
}

fn cpu_metric(target: &Value) -> Value {
    json!([{"type": "Resource", "resource": {"name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": target}}}])
}

/// A v1 body (object or merge patch) as v2.
pub fn to_v2(v: &mut Value) {
    let Some(obj) = v.as_object_mut() else { return };
    if obj.get("apiVersion").and_then(Value::as_str) == Some("autoscaling/v1") {
        obj.insert("apiVersion".into(), json!("autoscaling/v2"));
    }
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        if let Some(t) = spec.remove("targetCPUUtilizationPercentage") {
            if !t.is_null() {
                spec.insert("metrics".into(), cpu_metric(&t));
            }
        }
    }
    if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
        if let Some(c) = status.remove("currentCPUUtilizationPercentage") {
            status.insert(
                "currentMetrics".into(),
                json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": c}}}]),
            );
        }
    }
}

/// JSON patch paths of v1 fields, for v2.
pub fn json_patch_to_v2(ops: &mut Value) {
    for op in ops.as_array_mut().into_iter().flatten() {
        if op["path"] == "/spec/targetCPUUtilizationPercentage" {
            op["path"] = json!("/spec/metrics");
            if let Some(val) = op.get("value").cloned() {
                op["value"] = cpu_metric(&val);
            }
        }
    }
}

/// A v2 object, list, watch event or Table as v1 shows it.
pub fn to_v1(v: &mut Value) {
    crate::events_v1::each_object(v, "HorizontalPodAutoscaler", "autoscaling/v2", "autoscaling/v1", hpa_to_v1);
}

/// The `averageUtilization` of the CPU Resource metric of a v2 metric list (`target` in the
/// spec's, `current` in the status's).
fn cpu_utilization(metrics: &Value, which: &str) -> Option<Value> {
    metrics.as_array()?.iter().find_map(|m| {
        (m.pointer("/resource/name")? == "cpu")
            .then(|| m.pointer(&format!("/resource/{which}/averageUtilization")).cloned())?
    })
}

/// One HorizontalPodAutoscaler's v2 fields as v1's.
fn hpa_to_v1(obj: &mut serde_json::Map<String, Value>) {
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        let target = spec.remove("metrics").and_then(|m| cpu_utilization(&m, "target"));
        spec.remove("behavior");
        if let Some(t) = target {
            spec.insert("targetCPUUtilizationPercentage".into(), t);
        }
    }
    if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
        let current = status.remove("currentMetrics").and_then(|m| cpu_utilization(&m, "current"));
        status.remove("conditions");
        if let Some(c) = current {
            status.insert("currentCPUUtilizationPercentage".into(), c);
        }
        status.entry("currentReplicas").or_insert(json!(0));
        status.entry("desiredReplicas").or_insert(json!(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_autoscales_v1_into_v2_and_reads_it_back() {
        let mut v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": 1, "maxReplicas": 3, "targetCPUUtilizationPercentage": 50},
            "status": {"currentReplicas": 0, "desiredReplicas": 0}});
        let original = v1.clone();
        to_v2(&mut v1);
        assert_eq!(v1["apiVersion"], "autoscaling/v2");
        assert_eq!(v1["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 50);
        assert!(v1["spec"].get("targetCPUUtilizationPercentage").is_none());
        v1["status"]["currentMetrics"] = json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 72, "averageValue": "72m"}}}]);
        v1["status"]["conditions"] = json!([{"type": "AbleToScale"}]);
        to_v1(&mut v1);
        assert_eq!(v1["spec"], original["spec"]);
        assert_eq!(
            v1["status"],
            json!({"currentReplicas": 0, "desiredReplicas": 0, "currentCPUUtilizationPercentage": 72})
        );
        assert_eq!(
            v2_path("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers/web").as_deref(),
            Some("/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/web")
        );
        assert_eq!(v2_path("/apis/autoscaling/v1"), None);
        let mut patch = json!([{"op": "replace", "path": "/spec/targetCPUUtilizationPercentage", "value": 60}]);
        json_patch_to_v2(&mut patch);
        assert_eq!(patch[0]["value"][0]["resource"]["target"]["averageUtilization"], 60);
    }
}
