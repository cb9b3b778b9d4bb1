//! autoscaling/v2 HorizontalPodAutoscalers (stored as v2; autoscaling/v1 is served by
//! conversion): the defaults (`minReplicas: 1`, 80 % CPU when no metric is given, as the
//! controller assumes), validation with the real texts, and the Table kubectl shows (`NAME
//! REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE`).

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;

/// The CPU utilization a HorizontalPodAutoscaler without metrics aims at.
pub const DEFAULT_CPU_UTILIZATION: i32 = 80;

/// The target of a Resource metric on `cpu` with a Utilization target, if that is what the
/// HPA's first CPU metric is.
pub fn cpu_target(h: &HorizontalPodAutoscaler) -> Option<i32> {
    let metrics = h.spec.as_ref()?.metrics.clone().unwrap_or_default();
    if metrics.is_empty() {
        return Some(DEFAULT_CPU_UTILIZATION);
    }
    metrics.iter().find_map(|m| {
        let r = m.resource.as_ref().filter(|_| m.type_ == "Resource")?;
        (r.name == "cpu" && r.target.type_ == "Utilization").then_some(r.target.average_utilization).flatten()
    })
}

impl ApiObject for HorizontalPodAutoscaler {
    const KIND: Kind = Kind::HorizontalPodAutoscaler;
    const INFO: KindInfo = KindInfo {
        group: "autoscaling",
        version: "v2",
        short_names: &["hpa"],
        categories: &["all"],
        has_status: true,
        ..KindInfo::core("HorizontalPodAutoscaler", "horizontalpodautoscalers", "horizontalpodautoscaler")
    };

    fn apply_defaults(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            spec.min_replicas.get_or_insert(1);
            if spec.metrics.as_ref().is_none_or(|m| m.is_empty()) {
                spec.metrics = Some(vec![serde_json::from_value(json!({
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}
                }))
                .expect("a valid metric")]);
            }
        }
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let Some(spec) = &self.spec else {
            out.push(v::required(&FieldPath::root("spec"), ""));
            return out;
        };
        let path = FieldPath::root("spec");
        let target = path.child("scaleTargetRef");
        if spec.scale_target_ref.kind.is_empty() {
            out.push(v::required(&target.child("kind"), ""));
        }
        if spec.scale_target_ref.name.is_empty() {
            out.push(v::required(&target.child("name"), ""));
        }
        let min = spec.min_replicas.unwrap_or(1);
        if min < 1 {
            out.push(v::invalid(&path.child("minReplicas"), &min, "must be greater than or equal to 1"));
        }
        if spec.max_replicas < 1 {
            out.push(v::invalid(&path.child("maxReplicas"), &spec.max_replicas, "must be greater than 0"));
        } else if spec.max_replicas < min {
            out.push(v::invalid(
                &path.child("maxReplicas"),
                &spec.max_replicas,
                "must be greater than or equal to `minReplicas`",
            ));
        }
        for (i, m) in spec.metrics.iter().flatten().enumerate() {
            let mp = path.child("metrics").index(i);
            const TYPES: [&str; 5] = ["ContainerResource", "External", "Object", "Pods", "Resource"];
            if !TYPES.contains(&m.type_.as_str()) {
                out.push(v::not_supported(&mp.child("type"), m.type_.as_str(), &TYPES));
                continue;
            }
            if let Some(r) = m.resource.as_ref().filter(|_| m.type_ == "Resource") {
                let tp = mp.child("resource").child("target");
                match r.target.type_.as_str() {
                    "Utilization" => match r.target.average_utilization {
                        None => out.push(v::required(&tp.child("averageUtilization"), "must set either a target value or averageValue")),
                        Some(u) if u < 1 => out.push(v::invalid(&tp.child("averageUtilization"), &u, "must be greater than 0")),
                        _ => {}
                    },
                    "AverageValue" | "Value" => {}
                    other => out.push(v::not_supported(&tp.child("type"), other, &["AverageValue", "Utilization", "Value"])),
                }
            } else if m.type_ == "Resource" {
                out.push(v::required(&mp.child("resource"), "must populate information for the given metric source"));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Reference", "string", 0),
            col("Targets", "string", 0),
            col("MinPods", "string", 0),
            col("MaxPods", "string", 0),
            col("Replicas", "string", 0),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        let reference = format!("{}/{}", spec.scale_target_ref.kind, spec.scale_target_ref.name);
        let current = status.current_metrics.iter().flatten().find_map(|m| {
            let r = m.resource.as_ref()?;
            (r.name == "cpu").then_some(r.current.average_utilization).flatten()
        });
        let targets = match cpu_target(self) {
            Some(t) => format!(
                "cpu: {}/{t}%",
                current.map(|c| format!("{c}%")).unwrap_or_else(|| "<unknown>".into())
            ),
            None => "<none>".into(),
        };
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(reference),
            json!(targets),
            json!(spec.min_replicas.unwrap_or(1).to_string()),
            json!(spec.max_replicas.to_string()),
            json!(status.current_replicas.unwrap_or(0).to_string()),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(v: Value) -> HorizontalPodAutoscaler {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_validation_and_the_row() {
        let mut h = hpa(json!({"metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 5}}));
        h.apply_defaults();
        assert_eq!(h.validate(None), vec![]);
        assert_eq!((h.spec.as_ref().unwrap().min_replicas, cpu_target(&h)), (Some(1), Some(80)));
        let cells = h.cells(Timestamp::now());
        assert_eq!(cells[1..6], [json!("Deployment/web"), json!("cpu: <unknown>/80%"), json!("1"), json!("5"), json!("0")]);
        let bad = hpa(json!({"metadata": {"name": "x"}, "spec": {"scaleTargetRef": {"kind": "", "name": "w"},
            "minReplicas": 3, "maxReplicas": 2,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 0}}}]}}));
        let causes: Vec<String> = bad.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            causes,
            [
                "spec.scaleTargetRef.kind: Required value",
                "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`",
                "spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0",
            ]
        );
    }
}
