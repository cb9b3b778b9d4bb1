//! The lab as `podpath ui` draws it (pure): hosts and networks from the lab's plan, nodes, pods,
//! Services, Ingresses, Gateways and NetworkPolicies from the API's watched objects, and what
//! only the lab knows (processes, the load balancer's rotation, the agents' health, faults)
//! from the last read of the lab. The browser gets it whole on each change: a lab's picture is
//! tens of kilobytes, and a whole one never leaves the page half updated.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::plan::{self, Plan};
use crate::state::LabState;
use crate::watch::Snapshot;

/// Watched objects: resource (`pods`, `services`, …) → `NS/NAME` (or `NAME`) → object.
pub type Objects = BTreeMap<String, BTreeMap<String, Value>>;

/// What the UI's server knows besides the objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabView {
    /// The last read of the lab (`podpath watch`'s), when there was one.
    pub snapshot: Option<Snapshot>,
    /// Component → running.
    pub processes: BTreeMap<String, bool>,
    /// Why the API cannot be watched now (it is being retried), or `None` when it can.
    pub api_error: Option<String>,
    /// The lab was taken down while the UI runs.
    pub lab_down: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Picture {
    pub lab: LabSummary,
    pub hosts: Vec<Host>,
    pub networks: Vec<Network>,
    pub pods: Vec<Pod>,
    pub services: Vec<Service>,
    pub ingresses: Vec<Named>,
    pub gateways: Vec<Named>,
    /// HTTPRoutes: their parents, hostnames and each rule's backends with weights.
    pub routes: Vec<Named>,
    pub policies: Vec<Named>,
    pub faults: Vec<String>,
    /// `None` while the API is watched; else what is wrong (shown, and retried).
    pub api_error: Option<String>,
    pub lab_down: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LabSummary {
    pub name: String,
    pub proxy_mode: String,
    pub lb_mode: String,
    pub ip_family: String,
    pub api: String,
}

/// A machine of the lab (a network namespace).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Host {
    pub name: String,
    /// `client`, `gateway`, `control-plane` or `node`.
    pub role: String,
    pub addresses: Vec<String>,
    /// Nodes: the Ready condition's status (`True`, `False`, `Unknown`) and its reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// The host's own process (API server, lb-sim, node agent) runs.
    pub running: bool,
    /// Nodes: the service proxy's `/healthz` answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthz: Option<String>,
    pub faults: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Network {
    pub name: String,
    pub cidr: String,
    pub members: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pod {
    /// `NS/NAME`.
    pub id: String,
    pub node: Option<String>,
    pub ip: Option<String>,
    pub phase: String,
    pub ready: bool,
    pub restarts: u64,
    pub terminating: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Service {
    /// `NS/NAME`.
    pub id: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub cluster_ips: Vec<String>,
    /// `80/TCP → 8080`, with `nodePort 30080` when it has one.
    pub ports: Vec<String>,
    pub node_ports: Vec<u16>,
    pub lb_ips: Vec<String>,
    pub endpoints: Vec<Endpoint>,
    /// Nodes the load balancer sends this Service's LB IPs to.
    pub rotation: Vec<String>,
    /// The first port, for a "curl" of it.
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Endpoint {
    pub ip: String,
    pub ready: bool,
    pub pod: Option<String>,
    pub node: Option<String>,
}

/// An object shown by name with a line of what it says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Named {
    pub id: String,
    pub detail: String,
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn id_of(o: &Value) -> String {
    let m = &o["metadata"];
    match m["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", s(&m["name"])),
        _ => s(&m["name"]),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(String::from)).collect()
}

/// The picture (pure).
pub fn build(st: &LabState, objects: &Objects, view: &LabView) -> Picture {
    let plan = Plan::with_family(&st.name, st.nodes, st.ip_family);
    let empty = BTreeMap::new();
    let of = |r: &str| objects.get(r).unwrap_or(&empty);
    let snap = view.snapshot.clone().unwrap_or_default();
    let running = |c: &str| view.processes.get(c).copied().unwrap_or(false);
    let faults_of = |host: &str| -> Vec<String> {
        // `watch` words them `NODE KIND: DETAIL`.
        snap.faults.iter().filter(|f| f.starts_with(&format!("{host} "))).cloned().collect()
    };

    // The hosts that are not nodes: their role is their name.
    let fixed = |name: &str, addresses: &[std::net::Ipv4Addr], running: bool| Host {
        name: name.into(),
        role: name.into(),
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        ready: None,
        reason: None,
        pod_cidr: None,
        running,
        healthz: None,
        faults: vec![],
    };
    let mut hosts = vec![
        fixed("client", &[plan::CLIENT], true),
        fixed("gateway", &[plan::GATEWAY_EXTERNAL, plan::GATEWAY_UNDERLAY], running("lb-sim")),
        fixed("control-plane", &[plan::CONTROL_PLANE], running("apiserver-lite")),
    ];
    // Nodes the plan has, and any the API has beyond it (`podpath node add` before a re-read).
    let mut node_names: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
    for name in of("nodes").keys() {
        if !node_names.contains(name) {
            node_names.push(name.clone());
        }
    }
    for name in &node_names {
        let node = of("nodes").get(name);
        let ready = node.and_then(|n| {
            n["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Ready").cloned()
        });
        let addresses = match node {
            Some(n) => n["status"]["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["type"] == "InternalIP")
                .map(|a| s(&a["address"]))
                .collect(),
            None => plan.nodes.iter().filter(|n| &n.name == name).map(|n| n.ip.to_string()).collect(),
        };
        hosts.push(Host {
            name: name.clone(),
            role: "node".into(),
            addresses,
            ready: Some(ready.as_ref().map(|c| s(&c["status"])).unwrap_or_else(|| "Unknown".into())),
            reason: ready.as_ref().map(|c| s(&c["reason"])).filter(|r| !r.is_empty()),
            pod_cidr: node.and_then(|n| n["spec"]["podCIDR"].as_str().map(String::from)),
            running: running(name),
            healthz: snap.healthz.get(name).cloned(),
            faults: faults_of(name),
        });
    }

    let networks = vec![
        Network {
            name: "external".into(),
            cidr: format!("{}/24", plan::GATEWAY_EXTERNAL).replace(".1/24", ".0/24"),
            members: vec!["client".into(), "gateway".into()],
        },
        Network {
            name: "underlay".into(),
            cidr: format!("{}.0/24", plan::UNDERLAY_PREFIX.map(|b| b.to_string()).join(".")),
            members: ["gateway", "control-plane"].iter().map(|h| h.to_string()).chain(node_names.clone()).collect(),
        },
    ];

    let mut pod_by_ip: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    let mut pods = vec![];
    for p in of("pods").values() {
        let id = id_of(p);
        let node = p["spec"]["nodeName"].as_str().map(String::from);
        let ip = p["status"]["podIP"].as_str().map(String::from);
        if let Some(ip) = &ip {
            pod_by_ip.insert(ip.clone(), (id.clone(), node.clone()));
        }
        pods.push(Pod {
            id,
            node,
            ip,
            phase: p["status"]["phase"].as_str().unwrap_or("Pending").to_string(),
            ready: crate::watch::pod_ready(p),
            restarts: crate::watch::pod_restarts(p),
            terminating: p["metadata"]["deletionTimestamp"].is_string(),
        });
    }

    // EndpointSlices by their Service.
    let mut slices: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for sl in of("endpointslices").values() {
        if let Some(svc) = sl["metadata"]["labels"]["kubernetes.io/service-name"].as_str() {
            slices.entry(format!("{}/{svc}", s(&sl["metadata"]["namespace"]))).or_default().push(sl);
        }
    }
    let mut services = vec![];
    for svc in of("services").values() {
        let id = id_of(svc);
        let spec = &svc["spec"];
        let mut cluster_ips = strings(&spec["clusterIPs"]);
        if cluster_ips.is_empty() && spec["clusterIP"].is_string() {
            cluster_ips.push(s(&spec["clusterIP"]));
        }
        let mut ports = vec![];
        let mut node_ports = vec![];
        for p in spec["ports"].as_array().into_iter().flatten() {
            let target = match &p["targetPort"] {
                Value::Null => p["port"].to_string(),
                Value::String(t) => t.clone(),
                t => t.to_string(),
            };
            let mut text = format!("{}/{} → {target}", p["port"], p["protocol"].as_str().unwrap_or("TCP"));
            if let Some(np) = p["nodePort"].as_u64() {
                text.push_str(&format!(", nodePort {np}"));
                node_ports.push(np as u16);
            }
            ports.push(text);
        }
        let lb_ips: Vec<String> = svc["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ip"].as_str().map(String::from))
            .collect();
        let mut endpoints = vec![];
        let mut seen = BTreeSet::new();
        for sl in slices.get(&id).into_iter().flatten() {
            for e in sl["endpoints"].as_array().into_iter().flatten() {
                for ip in strings(&e["addresses"]) {
                    if !seen.insert(ip.clone()) {
                        continue;
                    }
                    let known = pod_by_ip.get(&ip);
                    endpoints.push(Endpoint {
                        ready: e["conditions"]["ready"].as_bool() != Some(false),
                        pod: e["targetRef"]["name"]
                            .as_str()
                            .map(|n| format!("{}/{n}", s(&sl["metadata"]["namespace"])))
                            .or_else(|| known.map(|k| k.0.clone())),
                        node: e["nodeName"].as_str().map(String::from).or_else(|| known.and_then(|k| k.1.clone())),
                        ip,
                    });
                }
            }
        }
        let mut rotation = BTreeSet::new();
        for (key, nodes) in &snap.rotation {
            // Keys read `VIP (NS/NAME)` (see `watch::snapshot`).
            if key.ends_with(&format!("({id})")) {
                rotation.extend(nodes.iter().cloned());
            }
        }
        services.push(Service {
            id,
            type_: spec["type"].as_str().unwrap_or("ClusterIP").to_string(),
            cluster_ips,
            port: spec["ports"][0]["port"].as_u64().map(|p| p as u16),
            ports,
            node_ports,
            lb_ips,
            endpoints,
            rotation: rotation.into_iter().collect(),
        });
    }

    let ingresses = of("ingresses")
        .values()
        .map(|i| {
            let rules: Vec<String> = i["spec"]["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|r| {
                    let host = r["host"].as_str().unwrap_or("*").to_string();
                    r["http"]["paths"].as_array().into_iter().flatten().map(move |p| {
                        format!(
                            "{host}{} → {}:{}",
                            p["path"].as_str().unwrap_or("/"),
                            s(&p["backend"]["service"]["name"]),
                            match &p["backend"]["service"]["port"]["number"] {
                                Value::Null => s(&p["backend"]["service"]["port"]["name"]),
                                n => n.to_string(),
                            }
                        )
                    })
                })
                .collect();
            Named { id: id_of(i), detail: rules.join("; ") }
        })
        .collect();
    let gateways = of("gateways")
        .values()
        .map(|g| {
            let addresses: Vec<String> =
                g["status"]["addresses"].as_array().into_iter().flatten().map(|a| s(&a["value"])).collect();
            let programmed = g["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Programmed")
                .map(|c| format!("Programmed={}", s(&c["status"])))
                .unwrap_or_else(|| "not programmed yet".into());
            let listeners: Vec<String> = g["spec"]["listeners"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| format!("{} {}/{}", s(&l["name"]), s(&l["protocol"]), l["port"]))
                .collect();
            Named {
                id: id_of(g),
                detail: format!("{} · {programmed} · {}", addresses.join(", "), listeners.join(", ")),
            }
        })
        .collect();
    let routes = of("httproutes")
        .values()
        .map(|r| {
            let parents: Vec<String> =
                r["spec"]["parentRefs"].as_array().into_iter().flatten().map(|p| s(&p["name"])).collect();
            let hosts = strings(&r["spec"]["hostnames"]);
            let rules: Vec<String> = r["spec"]["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|rule| {
                    let backends: Vec<String> = rule["backendRefs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|b| match b["weight"].as_u64() {
                            Some(w) => format!("{}:{} ×{w}", s(&b["name"]), b["port"]),
                            None => format!("{}:{}", s(&b["name"]), b["port"]),
                        })
                        .collect();
                    if backends.is_empty() {
                        "(filters only)".to_string()
                    } else {
                        backends.join(" + ")
                    }
                })
                .collect();
            Named {
                id: id_of(r),
                detail: format!(
                    "on {} · {} · {}",
                    parents.join(", "),
                    if hosts.is_empty() { "any host".to_string() } else { hosts.join(", ") },
                    rules.join("; ")
                ),
            }
        })
        .collect();
    let policies = of("networkpolicies")
        .values()
        .map(|p| {
            let sel = &p["spec"]["podSelector"]["matchLabels"];
            let selects = match sel.as_object() {
                Some(m) if !m.is_empty() => {
                    m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(",")
                }
                _ => "every pod".into(),
            };
            Named {
                id: id_of(p),
                detail: format!("selects {selects}; types {}", strings(&p["spec"]["policyTypes"]).join(", ")),
            }
        })
        .collect();

    Picture {
        lab: LabSummary {
            name: st.name.clone(),
            proxy_mode: st.proxy_mode.to_string(),
            lb_mode: st.lb_mode.to_string(),
            ip_family: crate::state::flag_value(&st.ip_family),
            api: st.api.clone(),
        },
        hosts,
        networks,
        pods,
        services,
        ingresses,
        gateways,
        routes,
        policies,
        faults: snap.faults.iter().cloned().collect(),
        api_error: view.api_error.clone(),
        lab_down: view.lab_down,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lab() -> LabState {
        serde_json::from_value(json!({
            "name": "t", "nodes": 2, "proxy_mode": "iptables", "lb_mode": "passthrough",
            "api": "127.0.0.1:1", "namespaces": [], "procs": [], "dir": "/nonexistent"
        }))
        .unwrap()
    }

    fn objects(list: &[(&str, Value)]) -> Objects {
        let mut o = Objects::new();
        for (r, v) in list {
            o.entry(r.to_string()).or_default().insert(id_of(v), v.clone());
        }
        o
    }

    #[test]
    fn a_service_shows_its_addresses_endpoints_and_rotation() {
        let objs = objects(&[
            (
                "nodes",
                json!({"metadata": {"name": "node-1"}, "spec": {"podCIDR": "10.244.1.0/24"},
                       "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                                  "addresses": [{"type": "InternalIP", "address": "192.168.56.11"}]}}),
            ),
            (
                "pods",
                json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"nodeName": "node-1"},
                       "status": {"phase": "Running", "podIP": "10.244.1.5",
                                  "conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
            (
                "services",
                json!({"metadata": {"name": "web", "namespace": "default"},
                       "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                                "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]},
                       "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.100"}]}}}),
            ),
            (
                "endpointslices",
                json!({"metadata": {"name": "web-abc", "namespace": "default",
                                    "labels": {"kubernetes.io/service-name": "web"}},
                       "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}}]}),
            ),
        ]);
        let mut snap = Snapshot::default();
        snap.rotation.insert("203.0.113.100 (default/web)".into(), ["node-1".to_string()].into());
        snap.faults.insert("node-2 link-down: eth0 (the uplink) down".into());
        let view = LabView { snapshot: Some(snap), ..Default::default() };
        let p = build(&lab(), &objs, &view);
        let names: Vec<&str> = p.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["client", "gateway", "control-plane", "node-1", "node-2"]);
        assert_eq!(p.hosts[3].ready.as_deref(), Some("True"));
        assert_eq!(p.hosts[3].pod_cidr.as_deref(), Some("10.244.1.0/24"));
        // A node the API does not know yet is Unknown, at its planned address.
        assert_eq!(
            (p.hosts[4].ready.as_deref(), p.hosts[4].addresses.clone()),
            (Some("Unknown"), vec!["192.168.56.12".to_string()])
        );
        assert_eq!(p.hosts[4].faults, ["node-2 link-down: eth0 (the uplink) down"]);
        assert!(p.hosts[3].faults.is_empty());
        let svc = &p.services[0];
        assert_eq!(svc.ports, ["80/TCP → 8080, nodePort 30080"]);
        assert_eq!(
            (svc.lb_ips.clone(), svc.rotation.clone()),
            (vec!["203.0.113.100".to_string()], vec!["node-1".to_string()])
        );
        assert_eq!(
            svc.endpoints,
            [Endpoint {
                ip: "10.244.1.5".into(),
                ready: true,
                pod: Some("default/web".into()),
                node: Some("node-1".into())
            }]
        );
        assert_eq!(p.networks[1].members, ["gateway", "control-plane", "node-1", "node-2"]);
    }

    #[test]
    fn a_route_shows_its_gateway_hosts_and_weighted_backends() {
        let objs = objects(&[(
            "httproutes",
            json!({"metadata": {"name": "shop", "namespace": "default"},
                   "spec": {"parentRefs": [{"name": "edge"}], "hostnames": ["shop.example"],
                            "rules": [{"backendRefs": [{"name": "v1", "port": 80, "weight": 90},
                                                       {"name": "v2", "port": 80, "weight": 10}]},
                                      {"filters": [{"type": "RequestRedirect"}]}]}}),
        )]);
        let p = build(&lab(), &objs, &LabView::default());
        assert_eq!(
            p.routes,
            [Named {
                id: "default/shop".into(),
                detail: "on edge · shop.example · v1:80 ×90 + v2:80 ×10; (filters only)".into()
            }]
        );
    }
}
