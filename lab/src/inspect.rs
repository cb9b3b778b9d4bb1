//! The service proxy's rules on every node as the kernel holds them: read (`iptables-save`, in
//! parallel), watched for changes after API changes (`podpath rules --watch`), and explained
//! for one Service (`podpath explain`).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::plan::Plan;
use crate::state::{ApiAccess, LabState};
use crate::{io, rules, trace, LabError, Result};

/// Per node: each table's `iptables-save` text.
pub type NodeTables = BTreeMap<String, Vec<(String, String)>>;

/// `iptables-save` (`ip6tables-save` with `v6`) of `tables` on every node of the lab, read in
/// parallel.
pub fn node_tables(st: &LabState, tables: &[&str], v6: bool) -> Result<NodeTables> {
    let plan = Plan::with_family(&st.name, st.nodes, st.ip_family);
    let nodes: Vec<(String, String)> =
        plan.nodes.iter().map(|n| (n.name.clone(), plan.netns_of(&n.name).expect("planned").to_string())).collect();
    type OneNode = (String, Vec<(String, String)>);
    let saves: Vec<Result<OneNode>> = std::thread::scope(|s| {
        let jobs: Vec<_> = nodes
            .iter()
            .map(|(node, netns)| {
                s.spawn(move || -> Result<OneNode> {
                    let mut out = Vec::new();
                    for table in tables {
                        let mut ipt = podpath_ruleset::Iptables::new(podpath_ruleset::Backend::System).in_netns(netns);
                        if v6 {
                            ipt = ipt.v6();
                        }
                        let tool = if v6 { "ip6tables-save" } else { "iptables-save" };
                        let save = ipt.save_text(table).map_err(|e| LabError::Command {
                            cmd: format!("{tool} -t {table} in {netns}"),
                            stderr: e.to_string(),
                        })?;
                        out.push((table.to_string(), save));
                    }
                    Ok((node.clone(), out))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(LabError::NotReady("a helper thread panicked".into()))))
            .collect()
    });
    saves.into_iter().collect()
}

/// Every node's proxy rules (nat and filter) as lines (`rules::proxy_rules`); a lab with IPv6
/// has its ip6tables rules too, their lines led by `ip6/nat` and `ip6/filter`.
pub fn proxy_rules(st: &LabState) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for v6 in families(st) {
        let rules = if st.proxy_mode == crate::ProxyMode::Nftables {
            nft_rules(st, v6)?
        } else {
            node_tables(st, &["nat", "filter"], v6)?
                .into_iter()
                .map(|(node, tables)| {
                    let lines = tables
                        .iter()
                        .flat_map(|(t, save)| {
                            rules::proxy_rules(&if v6 { format!("ip6/{t}") } else { t.clone() }, save)
                        })
                        .collect();
                    (node, lines)
                })
                .collect()
        };
        for (node, lines) in rules {
            out.entry(node).or_default().extend(lines);
        }
    }
    Ok(out)
}

/// The lab's families (`true`: IPv6).
fn families(st: &LabState) -> Vec<bool> {
    let mut out = vec![];
    if st.ip_family.has_v4() {
        out.push(false);
    }
    if st.ip_family.has_v6() {
        out.push(true);
    }
    out
}

/// In nftables mode: every node's table `ip kube-proxy` (`ip6 kube-proxy` with `v6`) as lines,
/// one per rule and per map or set element (`nft chain services: …`, `nft6 element
/// service-ips: …`).
fn nft_rules(st: &LabState, v6: bool) -> Result<BTreeMap<String, Vec<String>>> {
    let lead = if v6 { "nft6" } else { "nft" };
    Ok(nft_listings(st, v6)?
        .into_iter()
        .map(|(node, l)| (node, l.lines().into_iter().map(|l| format!("{lead} {l}")).collect()))
        .collect())
}

/// Every node's table `ip kube-proxy` (`ip6` with `v6`; `nft list table`), read in parallel.
fn nft_listings(st: &LabState, v6: bool) -> Result<BTreeMap<String, podpath_ruleset::nft::Listing>> {
    let plan = Plan::with_family(&st.name, st.nodes, st.ip_family);
    let nodes: Vec<(String, String)> =
        plan.nodes.iter().map(|n| (n.name.clone(), plan.netns_of(&n.name).expect("planned").to_string())).collect();
    type OneNode = (String, podpath_ruleset::nft::Listing);
    let lists: Vec<Result<OneNode>> = std::thread::scope(|s| {
        let jobs: Vec<_> = nodes
            .iter()
            .map(|(node, netns)| {
                s.spawn(move || -> Result<OneNode> {
                    let nft = podpath_ruleset::Nft::in_netns(netns);
                    let text = nft
                        .list_table(
                            if v6 { podpath_ruleset::nft::NftFamily::Ip6 } else { podpath_ruleset::nft::NftFamily::Ip },
                            "kube-proxy",
                            false,
                        )
                        .map_err(|e| LabError::Command {
                            cmd: format!("nft list table in {netns}"),
                            stderr: e.to_string(),
                        })?
                        .unwrap_or_default();
                    Ok((node.clone(), podpath_ruleset::nft::Listing::parse(&text)))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(LabError::NotReady("a helper thread panicked".into()))))
            .collect()
    });
    lists.into_iter().collect()
}

/// `Kind ns/name` → resourceVersion of the objects the service proxy renders rules from.
fn proxy_inputs(api: &ApiAccess) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (kind, path) in [("Service", "/api/v1/services"), ("EndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices")]
    {
        let doc = trace::run::api_get(api, path);
        for item in doc["items"].as_array().into_iter().flatten() {
            let m = &item["metadata"];
            let key = format!("{kind} {}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or(""));
            out.insert(key, m["resourceVersion"].as_str().unwrap_or("").to_string());
        }
    }
    out
}

/// What changed between two [`proxy_inputs`]: `Service default/web created`, …
fn input_changes(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            None => out.push(format!("{k} created")),
            Some(old) if old != v => out.push(format!("{k} changed")),
            _ => {}
        }
    }
    out.extend(before.keys().filter(|k| !after.contains_key(*k)).map(|k| format!("{k} deleted")));
    out
}

/// `podpath rules --watch`: after each change of a Service or EndpointSlice in the API, waits
/// for the nodes' rules to follow (they settle: unchanged for 300 ms, or 3 s pass) and writes
/// the rule changes of every node. Stops after `count` reports, if given.
pub fn watch_rules(st: &LabState, count: Option<usize>, out: &mut dyn Write) -> Result<()> {
    watch_rules_with(&ApiAccess::of(st)?, || proxy_rules(st), count, out)
}

/// `podpath rules --watch --vagrant`: the same on a Vagrant lab, its nodes' rules read over SSH.
pub fn watch_rules_vagrant(v: &crate::vagrant::VagrantLab, count: Option<usize>, out: &mut dyn Write) -> Result<()> {
    watch_rules_with(&v.api()?, || v.all_proxy_rules(), count, out)
}

/// [`watch_rules`] with every node's rules read by `read`.
fn watch_rules_with(
    api: &ApiAccess,
    read: impl Fn() -> Result<BTreeMap<String, Vec<String>>>,
    count: Option<usize>,
    out: &mut dyn Write,
) -> Result<()> {
    let mut rules = read()?;
    let mut inputs = proxy_inputs(api);
    let sizes: Vec<String> = rules.iter().map(|(n, r)| format!("{n} {} rules", r.len())).collect();
    let w = |out: &mut dyn Write, s: &str| out.write_all(s.as_bytes()).and_then(|_| out.flush());
    w(out, &format!("watching the service proxy's rules ({}); Ctrl-C stops\n", sizes.join(", ")))
        .map_err(io("write".to_string()))?;
    let mut reports = 0;
    while count.is_none_or(|c| reports < c) {
        std::thread::sleep(Duration::from_millis(200));
        let now = proxy_inputs(api);
        if now == inputs {
            continue;
        }
        let (deadline, mut last, mut settled_at) = (Instant::now() + Duration::from_secs(3), rules.clone(), None);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let current = read()?;
            if current != last {
                last = current;
                settled_at = Some(Instant::now());
            } else if settled_at.is_some_and(|t: Instant| t.elapsed() >= Duration::from_millis(300)) {
                break;
            }
        }
        // Everything that changed in the API until the rules settled: a change that arrived
        // meanwhile is in these rules too, so it is named with them.
        let now = proxy_inputs(api);
        let changes = input_changes(&inputs, &now);
        inputs = now;
        let per_node: BTreeMap<String, Vec<rules::Change>> = last
            .iter()
            .map(|(node, new)| (node.clone(), rules::diff(rules.get(node).map(Vec::as_slice).unwrap_or_default(), new)))
            .collect();
        let when = jiff::Zoned::now().strftime("%H:%M:%S").to_string();
        w(out, &rules::report(&when, &changes, &per_node)).map_err(io("write".to_string()))?;
        rules = last;
        reports += 1;
    }
    Ok(())
}

/// Explains a Service's rules on every node of the lab (`podpath explain`): the Service from
/// the API, `iptables-save` of the nat and filter tables of each node.
pub fn explain(st: &LabState, service: &str) -> Result<crate::explain::Explanation> {
    explain_with(
        &ApiAccess::of(st)?,
        service,
        st.proxy_mode == crate::ProxyMode::Nftables,
        |v6| node_tables(st, &["nat", "filter"], v6),
        |v6| nft_listings(st, v6),
    )
}

/// `podpath explain --vagrant`: the same explanation from the Vagrant lab's nodes (their rules
/// read over SSH).
pub fn explain_vagrant(v: &crate::vagrant::VagrantLab, service: &str) -> Result<crate::explain::Explanation> {
    explain_with(&v.api()?, service, v.nftables()?, |v6| v.node_tables(&["nat", "filter"], v6), |v6| v.nft_listings(v6))
}

/// [`explain`] with the nodes' rules read by the caller: `saves` (iptables modes) or
/// `listings` (the nftables mode), for the Service's family (`v6`).
fn explain_with(
    api: &ApiAccess,
    service: &str,
    nftables: bool,
    saves: impl FnOnce(bool) -> Result<NodeTables>,
    listings: impl FnOnce(bool) -> Result<BTreeMap<String, podpath_ruleset::nft::Listing>>,
) -> Result<crate::explain::Explanation> {
    let (ns, name) = service.split_once('/').unwrap_or(("default", service));
    if name.is_empty() || ns.is_empty() || name.contains('/') {
        return Err(LabError::Usage(format!("{service:?}: give a Service as NAME or NAMESPACE/NAME")));
    }
    let (code, body) = api.get(&format!("/api/v1/namespaces/{ns}/services/{name}"))?;
    match code {
        200 => {}
        404 => return Err(LabError::Usage(format!("service {ns}/{name} not found"))),
        c => return Err(LabError::NotReady(format!("the API server answered HTTP {c} for service {ns}/{name}"))),
    }
    let svc: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("service {ns}/{name}: {e}")))?;
    let pods: BTreeMap<std::net::IpAddr, String> =
        trace::run::pods_by_ip(api).into_iter().map(|(ip, (pod, _))| (ip, pod)).collect();
    // The rules of the Service's primary family (its `clusterIP`'s): ip6tables or `ip6
    // kube-proxy` for an IPv6 one.
    let v6 = svc["spec"]["clusterIP"].as_str().is_some_and(|ip| ip.contains(':'));
    let slices = trace::run::api_get(
        api,
        &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{name}"),
    );
    let slices = slices["items"].as_array().cloned().unwrap_or_default();
    if nftables {
        return Ok(crate::explain::explain_nft(&svc, &slices, &listings(v6)?, &pods));
    }
    Ok(crate::explain::explain(&svc, &slices, &saves(v6)?, &pods))
}
