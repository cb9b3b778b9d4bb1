//! apps/v1 Deployments: defaults, validation (strategy, selector, template) and the Table; the
//! controller that rolls them out is in apiserver-lite.

use k8s_openapi::api::apps::v1::{DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use jiff::Timestamp;
use serde_json::{json, Value};

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::table::{col, Column};
use crate::validation::{self as v, Cause, FieldPath};
use crate::apps::{default_template, is_zero, selector_unchanged, validate_int_or_percent, validate_replicated, workload_cells, workload_columns};

pub use k8s_openapi::api::apps::v1::Deployment;

impl ApiObject for Deployment {
    const KIND: Kind = Kind::Deployment;
    const INFO: KindInfo = KindInfo {
        group: "apps",
        short_names: &["deploy"],
        categories: &["all"],
        has_status: true,
        has_scale: true,
        has_generation: true,
        ..KindInfo::core("Deployment", "deployments", "deployment")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        spec.revision_history_limit.get_or_insert(10);
        spec.progress_deadline_seconds.get_or_insert(600);
        let strategy = spec.strategy.get_or_insert_with(DeploymentStrategy::default);
        let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into()).clone();
        if kind == "RollingUpdate" {
            let ru = strategy.rolling_update.get_or_insert_with(RollingUpdateDeployment::default);
            ru.max_unavailable.get_or_insert(IntOrString::String("25%".into()));
            ru.max_surge.get_or_insert(IntOrString::String("25%".into()));
        }
        default_template(&mut spec.template);
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        let path = FieldPath::root("spec");
        let Some(spec) = meta_and_spec(&self.metadata, v::dns1123_subdomain, self.spec.as_ref(), &mut out) else {
            return out;
        };
        validate_replicated("deployment", spec.replicas, &spec.selector, Some(&spec.template), &path, &mut out);
        if let Some(strategy) = &spec.strategy {
            let sp = path.child("strategy");
            match strategy.type_.as_deref() {
                Some("Recreate") if strategy.rolling_update.is_some() => out.push(v::forbidden(
                    &sp.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                )),
                Some("Recreate") | None => {}
                Some("RollingUpdate") => {
                    if let Some(ru) = &strategy.rolling_update {
                        let rp = sp.child("rollingUpdate");
                        if let Some(s) = &ru.max_surge {
                            validate_int_or_percent(s, &rp.child("maxSurge"), &mut out);
                        }
                        if let Some(u) = &ru.max_unavailable {
                            validate_int_or_percent(u, &rp.child("maxUnavailable"), &mut out);
                        }
                        if is_zero(ru.max_surge.as_ref()) && is_zero(ru.max_unavailable.as_ref()) {
                            out.push(v::invalid(&rp.child("maxUnavailable"), &0, "may not be 0 when `maxSurge` is 0"));
                        }
                    }
                }
                Some(other) => out.push(v::not_supported(&sp.child("type"), other, &["Recreate", "RollingUpdate"])),
            }
        }
        if let Some(n) = spec.revision_history_limit.filter(|n| *n < 0) {
            out.push(v::invalid(&path.child("revisionHistoryLimit"), &n, "must be greater than or equal to 0"));
        }
        selector_unchanged(old.and_then(|o| o.spec.as_ref()).map(|s| &s.selector), &spec.selector, &path, &mut out);
        out
    }

    fn columns() -> Vec<Column> {
        workload_columns([col("Ready", "string", 0), col("Up-to-date", "integer", 0), col("Available", "integer", 0)])
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        let counts = [
            json!(format!("{}/{}", status.ready_replicas.unwrap_or(0), spec.replicas.unwrap_or(1))),
            json!(status.updated_replicas.unwrap_or(0)),
            json!(status.available_replicas.unwrap_or(0)),
        ];
        workload_cells(&self.metadata, counts, Some(&spec.template), &spec.selector, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(yaml: &str) -> Deployment {
        let mut d: Deployment = serde_yaml::from_str(yaml).unwrap();
        d.apply_defaults();
        d
    }

    const WEB: &str = "
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: echo, image: podpath/echo}]}
";

    #[test]
    fn defaults_are_the_api_servers() {
        let d = deployment(WEB);
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.revision_history_limit, Some(10));
        assert_eq!(spec.progress_deadline_seconds, Some(600));
        let s = spec.strategy.unwrap();
        assert_eq!(s.type_.as_deref(), Some("RollingUpdate"));
        let ru = s.rolling_update.unwrap();
        assert_eq!(ru.max_surge, Some(IntOrString::String("25%".into())));
        assert_eq!(ru.max_unavailable, Some(IntOrString::String("25%".into())));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
        assert_eq!(pod.containers[0].image_pull_policy.as_deref(), Some("Always"));
    }

    #[test]
    fn a_valid_deployment_has_no_causes() {
        assert_eq!(deployment(WEB).validate(None), vec![]);
    }

    #[test]
    fn mistakes_are_named_as_the_api_server_names_them() {
        let cases = [
            ("replicas: -1", "spec.replicas: Invalid value: -1: must be greater than or equal to 0"),
            (
                "template: {metadata: {labels: {app: other}}, spec: {containers: [{name: a, image: b}]}}",
                "spec.template.metadata.labels: Invalid value: \"app=other\": `selector` does not match template `labels`",
            ),
            ("selector: {}", "spec.selector: Invalid value: \"<none>\": empty selector is invalid for deployment"),
            (
                "strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 0, maxUnavailable: 0}}",
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
            ),
            (
                "strategy: {type: Blue}",
                "spec.strategy.type: Unsupported value: \"Blue\": supported values: \"Recreate\", \"RollingUpdate\"",
            ),
            (
                "strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 120%}}",
                "spec.strategy.rollingUpdate.maxSurge: Invalid value: \"120%\": must not be greater than 100%",
            ),
            (
                "template: {metadata: {labels: {app: web}}, spec: {restartPolicy: Never, containers: [{name: a, image: b}]}}",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
            ),
        ];
        for (patch, want) in cases {
            let mut base: serde_yaml::Value = serde_yaml::from_str(WEB).unwrap();
            let extra: serde_yaml::Mapping = serde_yaml::from_str(patch).unwrap();
            for (k, val) in extra {
                base["spec"][k] = val;
            }
            let mut d: Deployment = serde_yaml::from_value(base).unwrap();
            d.apply_defaults();
            let causes: Vec<String> = d.validate(None).iter().map(|c| c.to_string()).collect();
            assert!(causes.iter().any(|c| c == want), "{patch}: {causes:?}");
        }
    }

    #[test]
    fn the_selector_is_immutable() {
        let old = deployment(WEB);
        let mut new = old.clone();
        let spec = new.spec.as_mut().unwrap();
        spec.selector.match_labels.as_mut().unwrap().insert("tier".into(), "x".into());
        spec.template.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert("tier".into(), "x".into());
        let causes: Vec<String> = new.validate(Some(&old)).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["spec.selector: Invalid value: \"app=web,tier=x\": field is immutable"]);
    }

    #[test]
    fn cells_follow_kubectl() {
        let mut d = deployment(WEB);
        d.spec.as_mut().unwrap().replicas = Some(3);
        d.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
            ready_replicas: Some(2),
            updated_replicas: Some(3),
            available_replicas: Some(2),
            ..Default::default()
        });
        let cells = d.cells(Timestamp::now());
        assert_eq!(cells[..4], [json!("web"), json!("2/3"), json!(3), json!(2)]);
        assert_eq!(cells[5..], [json!("echo"), json!("podpath/echo"), json!("app=web")]);
    }
}
