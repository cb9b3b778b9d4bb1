//! `podpath explain gateway NAME`: a Gateway as the API sees it (its conditions, address and
//! listeners, the routes attached) and as the lab's gateway serves it (each listener's rules in
//! words, with their backends' weights and endpoints, and what it has answered).

use serde::Serialize;
use serde_json::Value;

use crate::state::{ApiAccess, LabState};
use crate::{LabError, Result};

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayExplanation {
    pub gateway: String,
    pub class: String,
    pub addresses: Vec<String>,
    /// `Type Status (Reason: message)`.
    pub conditions: Vec<String>,
    /// One line per listener: protocol, port, hostname, attached routes, conditions.
    pub listeners: Vec<String>,
    /// What lb-sim serves for it: per port, its rules in words.
    pub served: Vec<String>,
    pub notes: Vec<String>,
}

fn conditions(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
            let msg = s("message");
            let msg = if msg.is_empty() { String::new() } else { format!(": {msg}") };
            format!("{} {} ({}{msg})", s("type"), s("status"), s("reason"))
        })
        .collect()
}

/// Explains a Gateway from its object and lb-sim's status document. Pure.
pub fn explain_gateway(gw: &Value, lb: Option<&Value>) -> GatewayExplanation {
    let meta = &gw["metadata"];
    let key = format!("{}/{}", meta["namespace"].as_str().unwrap_or("default"), meta["name"].as_str().unwrap_or(""));
    let status = &gw["status"];
    let listeners = gw["spec"]["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let name = l["name"].as_str().unwrap_or("");
            let st = status["listeners"].as_array().into_iter().flatten().find(|s| s["name"] == name);
            let attached = st.and_then(|s| s["attachedRoutes"].as_u64()).unwrap_or(0);
            let host = l["hostname"].as_str().map(|h| format!(" {h}")).unwrap_or_default();
            let conds = st.map(|s| conditions(&s["conditions"])).unwrap_or_default();
            format!(
                "{name}: {} port {}{host}, {attached} route(s) attached; {}",
                l["protocol"].as_str().unwrap_or("?"),
                l["port"],
                if conds.is_empty() { "no status yet".to_string() } else { conds.join(", ") }
            )
        })
        .collect();
    let mut served = Vec::new();
    let mut notes = Vec::new();
    match lb {
        None => notes.push("lb-sim's status could not be read: what the gateway serves is not shown".into()),
        Some(doc) => {
            let sites: Vec<&Value> =
                doc["gateways"].as_array().into_iter().flatten().filter(|s| s["gateway"] == key.as_str()).collect();
            if sites.is_empty() {
                notes.push("the lab's gateway serves nothing for it (no address yet, or no valid listener)".into());
            }
            for s in sites {
                let r = &s["requests"];
                served.push(format!(
                    "{}:{}{}: {} requests ({} proxied, {} redirected, {} not found, {} failed)",
                    s["vip"].as_str().unwrap_or(""),
                    s["port"],
                    if s["https"] == true { " (HTTPS)" } else { "" },
                    r["total"],
                    r["proxied"],
                    r["redirected"],
                    r["notFound"],
                    r["failed"]
                ));
                for rule in s["rules"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                    served.push(format!("  {rule}"));
                }
            }
        }
    }
    GatewayExplanation {
        gateway: key,
        class: gw["spec"]["gatewayClassName"].as_str().unwrap_or("").to_string(),
        addresses: status["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["value"].as_str().map(str::to_string))
            .collect(),
        conditions: conditions(&status["conditions"]),
        listeners,
        served,
        notes,
    }
}

/// Reads the Gateway and lb-sim's status.
pub fn explain(st: &LabState, target: &str) -> Result<GatewayExplanation> {
    explain_with(&ApiAccess::of(st)?, target, || crate::lb_status(st).ok())
}

/// [`explain`] on the Vagrant lab: lb-sim's status read on the gateway VM.
pub fn explain_vagrant(v: &crate::vagrant::VagrantLab, target: &str) -> Result<GatewayExplanation> {
    explain_with(&v.api()?, target, || {
        let body = v
            .run("gateway", &["curl", "-sS", "--max-time", "3", &format!("http://{}/status", crate::state::LB_STATUS)]);
        body.ok().and_then(|b| serde_json::from_str(&b).ok())
    })
}

fn explain_with(
    api: &ApiAccess,
    target: &str,
    lb_status: impl FnOnce() -> Option<Value>,
) -> Result<GatewayExplanation> {
    let (ns, name) = target.split_once('/').unwrap_or(("default", target));
    let path = format!("/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/gateways/{name}");
    let (code, body) = api.get(&path)?;
    let gw: Value = match code {
        200 => serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("{path}: not JSON: {e}")))?,
        404 => {
            return Err(LabError::Usage(format!(
                "gateway {ns}/{name} not found (are the Gateway API CRDs installed? kubectl get crd gateways.gateway.networking.k8s.io)"
            )))
        }
        c => return Err(LabError::NotReady(format!("{path} answered HTTP {c}"))),
    };
    Ok(explain_gateway(&gw, lb_status().as_ref()))
}

pub fn text(e: &GatewayExplanation) -> String {
    let mut out = format!("Gateway {} (class {})\n", e.gateway, e.class);
    out += &format!(
        "  address: {}\n",
        if e.addresses.is_empty() { "none yet".to_string() } else { e.addresses.join(", ") }
    );
    for c in &e.conditions {
        out += &format!("  {c}\n");
    }
    out += "listeners:\n";
    for l in &e.listeners {
        out += &format!("  {l}\n");
    }
    if !e.served.is_empty() {
        out += "served by the lab's gateway (lb-sim):\n";
        for s in &e.served {
            out += &format!("  {s}\n");
        }
    }
    for n in &e.notes {
        out += &format!("note: {n}\n");
    }
    out
}

// === podpath gateway-api install ===

/// The five standard-channel kinds the lab's gateway implements: (kind, plural, short names,
/// scope, printer columns (name, type, JSONPath)).
type KindRow = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
    &'static [(&'static str, &'static str, &'static str)],
);

const KINDS: &[KindRow] = &[
    (
        "GatewayClass",
        "gatewayclasses",
        &["gc"],
        "Cluster",
        &[
            ("Controller", "string", ".spec.controllerName"),
            ("Accepted", "string", ".status.conditions[?(@.type==\"Accepted\")].status"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ],
    ),
    (
        "Gateway",
        "gateways",
        &["gtw"],
        "Namespaced",
        &[
            ("Class", "string", ".spec.gatewayClassName"),
            ("Address", "string", ".status.addresses[*].value"),
            ("Programmed", "string", ".status.conditions[?(@.type==\"Programmed\")].status"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ],
    ),
    (
        "HTTPRoute",
        "httproutes",
        &[],
        "Namespaced",
        &[("Hostnames", "string", ".spec.hostnames"), ("Age", "date", ".metadata.creationTimestamp")],
    ),
    (
        "GRPCRoute",
        "grpcroutes",
        &[],
        "Namespaced",
        &[("Hostnames", "string", ".spec.hostnames"), ("Age", "date", ".metadata.creationTimestamp")],
    ),
    (
        "ReferenceGrant",
        "referencegrants",
        &["refgrant"],
        "Namespaced",
        &[("Age", "date", ".metadata.creationTimestamp")],
    ),
];

/// podpath's own CRDs of those kinds, for labs without the internet: their schemas keep spec
/// and status whole (the lab's gateway reads what it implements); the released CRDs add their
/// full schemas and CEL rules, and apply unchanged when you have them.
pub fn lab_crds() -> Vec<Value> {
    KINDS
        .iter()
        .map(|(kind, plural, short, scope, columns)| {
            let cols: Vec<Value> =
                columns.iter().map(|(n, t, p)| serde_json::json!({"name": n, "type": t, "jsonPath": p})).collect();
            let keep = serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
            serde_json::json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.gateway.networking.k8s.io"),
                             "annotations": {"podpath.dev/gateway-api": "lab copy of the standard channel's kinds"}},
                "spec": {
                    "group": "gateway.networking.k8s.io",
                    "scope": scope,
                    "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural,
                              "singular": kind.to_lowercase(), "shortNames": short, "categories": ["gateway-api"]},
                    "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                                  "additionalPrinterColumns": cols,
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                                                 "properties": {"spec": keep, "status": keep}}}}],
                },
            })
        })
        .collect()
}

/// `podpath gateway-api install`: the lab's CRDs where none of the kind exists yet (released
/// ones already installed are left as they are), then the GatewayClass `podpath`. Returns
/// what was done, a line each.
pub fn install(st: &LabState) -> Result<Vec<String>> {
    let api = ApiAccess::of(st)?;
    let mut out = Vec::new();
    for crd in lab_crds() {
        let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
        let (code, body) =
            api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd.to_string())?;
        match code {
            201 => out.push(format!("customresourcedefinition.apiextensions.k8s.io/{name} created")),
            409 => {
                out.push(format!("customresourcedefinition.apiextensions.k8s.io/{name} unchanged (already installed)"))
            }
            c => return Err(LabError::NotReady(format!("creating CRD {name}: HTTP {c}: {body}"))),
        }
    }
    // The kinds are served once established (well within a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (code, _) = api.get("/apis/gateway.networking.k8s.io/v1/gatewayclasses")?;
        if code == 200 {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(LabError::NotReady(
                "the Gateway API kinds are not served 10 s after their CRDs were made".into(),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let class = serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "podpath"}, "spec": {"controllerName": "podpath.dev/gateway",
        "description": "The lab's gateway (lb-sim): Gateways get an address from the LoadBalancer pool"}});
    let (code, body) = api.request("POST", "/apis/gateway.networking.k8s.io/v1/gatewayclasses", &class.to_string())?;
    match code {
        201 => out.push("gatewayclass.gateway.networking.k8s.io/podpath created".into()),
        409 => out.push("gatewayclass.gateway.networking.k8s.io/podpath unchanged".into()),
        c => return Err(LabError::NotReady(format!("creating GatewayClass podpath: HTTP {c}: {body}"))),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_gateway_in_words() {
        let gw = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"gatewayClassName": "podpath", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]},
            "status": {"addresses": [{"value": "198.51.100.3"}],
                "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed", "message": "served"}],
                "listeners": [{"name": "http", "attachedRoutes": 2, "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}]}});
        let lb = json!({"gateways": [{"gateway": "default/web", "vip": "198.51.100.3", "port": 80, "https": false,
            "rules": ["listener http (*): HTTPRoute default/web rule 0: PathPrefix / → default/web:80 (weight 1: 10.244.1.5:8080)"],
            "requests": {"total": 3, "proxied": 3, "redirected": 0, "notFound": 0, "failed": 0}}]});
        let t = text(&explain_gateway(&gw, Some(&lb)));
        assert!(t.contains("Gateway default/web (class podpath)"), "{t}");
        assert!(t.contains("address: 198.51.100.3"), "{t}");
        assert!(t.contains("http: HTTP port 80, 2 route(s) attached; Accepted True (Accepted)"), "{t}");
        assert!(t.contains("198.51.100.3:80: 3 requests (3 proxied"), "{t}");
        assert!(t.contains("HTTPRoute default/web rule 0: PathPrefix / → default/web:80"), "{t}");
        let t = text(&explain_gateway(&gw, None));
        assert!(t.contains("note: lb-sim's status could not be read"), "{t}");
    }
}
