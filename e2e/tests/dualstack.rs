//! IPv6 and dual-stack labs end to end (`podpath up --ip-family ipv6|dual`), with the real
//! kubectl: the client reaches a LoadBalancer Service over IPv6 (and IPv4) through the
//! passthrough gateway, a NodePort over IPv6, a pod a ClusterIP over IPv6 and the cluster DNS
//! answers AAAA; the nodes hold kube-proxy's ip6tables rules or its `ip6 kube-proxy` table.
//! Root only (CI runs as root).

use std::time::Duration;

use podpath_e2e::{wait_for, Lab};
use testkit::netns::{host_state, root_or_explain};

const WEB: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers: [{name: echo, image: podpath/echo, ports: [{containerPort: 8080}]}]
";

fn service(policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  type: LoadBalancer\n  ipFamilyPolicy: {policy}\n  \
         selector: {{app: web}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
    )
}

/// The pods of `app=web` the client reaches at `url` in a few tries (both, eventually); a
/// request that fails ends the tries with its error.
fn pods_reached(lab: &Lab, url: &str) -> Result<std::collections::BTreeSet<String>, String> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let (code, out) = lab.curl(&["-g", url]);
        if code != 0 {
            return Err(format!("curl {url} exited {code}: {out}"));
        }
        if let Some(pod) = out.lines().find_map(|l| l.strip_prefix("pod: ")) {
            seen.insert(pod.to_string());
        }
        if seen.len() == 2 {
            break;
        }
    }
    Ok(seen)
}

/// Waits (20 s at most) until the client has reached both pods at `url`: a request refused
/// while the path is still being programmed (the endpoints are in, the gateway's or the node's
/// rules may lag them) is one more try; at the end of the wait, the last failure is shown.
fn both_pods_answer(lab: &Lab, url: &str) {
    wait_for(Duration::from_secs(20), &format!("both pods at {url}"), || match pods_reached(lab, url)? {
        s if s.len() == 2 => Ok(()),
        s => Err(format!("{s:?}")),
    });
}

/// Waits (20 s at most) until the client's request to `url` is answered (`answered`) or not.
fn wait_client(lab: &Lab, url: &str, answered: bool) {
    let what = if answered { "answered" } else { "refused" };
    wait_for(Duration::from_secs(20), &format!("{url} to be {what}"), || {
        let (code, out) = lab.curl(&["--max-time", "2", "-g", url]);
        if (code == 0) == answered {
            Ok(())
        } else {
            Err(out)
        }
    });
}

/// Waits until the Service's endpoints of `family` hold both pods.
fn wait_endpoints(lab: &Lab, family: &str) {
    lab.kubectl_until(
        Duration::from_secs(30),
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            &format!("jsonpath={{range .items[?(@.addressType==\"{family}\")]}}{{.endpoints[*].addresses[0]}}{{end}}"),
        ],
        |o| o.split_whitespace().count() == 2,
    );
}

/// A busybox pod to ask from, Ready.
fn client_pod(lab: &Lab) {
    lab.kubectl(&["run", "cl", "--image=busybox", "--restart=Never", "--", "sleep", "3600"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/cl", "--timeout=60s"]);
}

#[test]
fn an_ipv6_lab_serves_a_load_balancer_a_node_port_a_cluster_ip_and_aaaa_records() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let lab = Lab::up("v6", &["--nodes", "2", "--ip-family", "ipv6"]).expect("podpath up --ip-family ipv6");
    let nodes = lab.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.addresses[0].address}"]);
    assert_eq!(nodes, "fd00:56::11 fd00:56::12");
    let cidrs = lab.kubectl(&["get", "node", "node-1", "-o", "jsonpath={.spec.podCIDRs}"]);
    assert_eq!(cidrs, "[\"fd00:10:244:1::/64\"]");
    lab.apply(WEB);
    lab.apply(&service("SingleStack"));
    lab.kubectl(&["rollout", "status", "deploy/web", "--timeout=60s"]);
    let families = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.ipFamilies} {.spec.clusterIP}"]);
    assert!(families.starts_with("[\"IPv6\"] fd00:10:96::"), "{families}");
    let cluster_ip = families.split(' ').nth(1).unwrap().to_string();
    wait_endpoints(&lab, "IPv6");
    let lb = lab.lb_ip("web");
    assert_eq!(lb, "2001:db8:100::1");
    // Through the gateway's passthrough routes (IPv6 nexthops) to both pods.
    both_pods_answer(&lab, "http://[2001:db8:100::1]/");
    let node_port = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let (code, out) = lab.curl(&["-g", &format!("http://[fd00:56::12]:{node_port}/")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pod: default/web-"), "{out}");
    // From a pod: the ClusterIP over IPv6, and the cluster DNS (fd00:10:96::a) answering AAAA.
    client_pod(&lab);
    let resolv = lab.kubectl(&["exec", "cl", "--", "cat", "/etc/resolv.conf"]);
    assert!(resolv.contains("nameserver fd00:10:96::a"), "{resolv}");
    let page = lab.kubectl(&["exec", "cl", "--", "wget", "-qO-", &format!("http://[{cluster_ip}]/")]);
    assert!(page.contains("pod: default/web-"), "{page}");
    let answer = lab.kubectl(&["exec", "cl", "--", "nslookup", "-type=AAAA", "web.default.svc.cluster.local"]);
    assert!(answer.contains(&cluster_ip), "{answer}");
    // kube-proxy's ip6tables rules on the node, as on a real IPv6 node.
    let nat = lab.exec("node-1", &["ip6tables-save", "-t", "nat"]);
    assert!(
        nat.contains(&format!(
            "-A KUBE-SERVICES -d {cluster_ip}/128 -p tcp -m comment --comment \"default/web cluster IP\""
        )),
        "{nat}"
    );
    assert!(nat.contains("! -d ::1/128"), "{nat}");
    // `podpath explain` and `podpath rules` read the ip6tables rules of an IPv6 lab.
    let (ok, explained) = lab.run("explain", &["web"]);
    assert!(ok, "{explained}");
    assert!(explained.contains(&format!("to [{cluster_ip}]:80/tcp (cluster IP) → KUBE-SVC-")), "{explained}");
    assert!(explained.contains("rewrite the destination to [fd00:10:244:"), "{explained}");
    let (ok, rules) = lab.run("rules", &[]);
    assert!(ok && rules.contains("ip6/nat -A KUBE-SERVICES -d "), "{rules}");
    // `podpath trace` over IPv6: ip6tables' rules as ip6tables-save prints them, from the
    // client through the LB; by name from a pod, the AAAA lookup first.
    let (ok, traced) = lab.run("trace", &["http://[2001:db8:100::1]/"]);
    assert!(ok, "{traced}");
    for want in [
        "client [2001:db8:113::10]:",
        "\"default/web loadbalancer IP\"",
        "-j DNAT --to-destination [fd00:10:244:",
        "answered 200",
    ] {
        assert!(traced.contains(want), "{want}: {traced}");
    }
    let (ok, traced) = lab.run("trace", &["--from", "pod/default/cl", "http://web.default/"]);
    assert!(ok, "{traced}");
    assert!(traced.contains("nameserver fd00:10:96::a"), "{traced}");
    assert!(traced.contains("AAAA? web.default.default.svc.cluster.local. → NXDOMAIN"), "{traced}");
    assert!(traced.contains(&format!("{cluster_ip} is the ClusterIP of Service default/web")), "{traced}");
    assert!(traced.contains("\"default/web cluster IP\""), "{traced}");
    // A NetworkPolicy with IPv6 ipBlocks: the pod network in, the "internet" client out.
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-in}\nspec:\n  \
         podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from:\n    - ipBlock: {cidr: \"fd00:10:244::/56\"}\n    \
         - ipBlock: {cidr: \"2001:db8:113::/64\", except: [\"2001:db8:113::10/128\"]}\n",
    );
    wait_client(&lab, "http://[2001:db8:100::1]/", false);
    // The trace names the policy that dropped the request, and its ip6tables rule.
    let (_, traced) = lab.run("trace", &["--timeout", "1", "http://[2001:db8:100::1]/"]);
    assert!(traced.contains("(isolated by default/web-in)") && traced.contains("-j DROP"), "{traced}");
    let page = lab.kubectl(&["exec", "cl", "--", "wget", "-qO-", "-T", "5", &format!("http://[{cluster_ip}]/")]);
    assert!(page.contains("pod: default/web-"), "pods are still let in: {page}");
    let table = lab.exec("node-1", &["ip6tables-save", "-t", "filter"]);
    assert!(table.contains("-A PODPATH-POLICY"), "{table}");
    lab.kubectl(&["delete", "networkpolicy", "web-in"]);
    wait_client(&lab, "http://[2001:db8:100::1]/", true);
    drop(lab);
    assert_eq!(host_state(), before, "the host namespace changed");
}

#[test]
fn a_dual_stack_lab_in_nftables_mode_answers_both_families() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let lab = Lab::up("ds", &["--nodes", "2", "--ip-family", "dual", "--proxy-mode", "nftables"])
        .expect("podpath up --ip-family dual");
    let cidrs = lab.kubectl(&["get", "node", "node-2", "-o", "jsonpath={.spec.podCIDRs}"]);
    assert_eq!(cidrs, "[\"10.244.2.0/24\",\"fd00:10:244:2::/64\"]");
    lab.apply(WEB);
    lab.apply(&service("RequireDualStack"));
    lab.kubectl(&["rollout", "status", "deploy/web", "--timeout=60s"]);
    let ips = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIPs[*]}"]);
    let ips: Vec<&str> = ips.split(' ').collect();
    assert!(ips.len() == 2 && ips[0].starts_with("10.") && ips[1].starts_with("fd00:10:96::"), "{ips:?}");
    let ingress = lab.kubectl_until(
        Duration::from_secs(30),
        &["get", "svc", "web", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"],
        |o| o.split(' ').count() == 2,
    );
    assert_eq!(ingress, "198.51.100.1 2001:db8:100::1");
    let pod_ips = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].status.podIPs[*].ip}"]);
    assert_eq!(pod_ips.split(' ').count(), 2, "{pod_ips}");
    wait_endpoints(&lab, "IPv4");
    wait_endpoints(&lab, "IPv6");
    for url in ["http://198.51.100.1/", "http://[2001:db8:100::1]/"] {
        both_pods_answer(&lab, url);
    }
    client_pod(&lab);
    let page = lab.kubectl(&["exec", "cl", "--", "wget", "-qO-", &format!("http://[{}]/", ips[1])]);
    assert!(page.contains("pod: default/web-"), "{page}");
    let a = lab.kubectl(&["exec", "cl", "--", "nslookup", "-type=A", "web.default.svc.cluster.local"]);
    assert!(a.contains(ips[0]), "{a}");
    let aaaa = lab.kubectl(&["exec", "cl", "--", "nslookup", "-type=AAAA", "web.default.svc.cluster.local"]);
    assert!(aaaa.contains(ips[1]), "{aaaa}");
    // One table per family, as kube-proxy's nftables mode keeps them.
    let v6 = lab.exec("node-1", &["nft", "list", "table", "ip6", "kube-proxy"]);
    assert!(v6.contains(&format!("{} . tcp . 80 : goto service-", ips[1])), "{v6}");
    assert!(v6.contains("type ipv6_addr"), "{v6}");
    let (ok, rules) = lab.run("rules", &[]);
    assert!(
        ok && rules.contains("nft6 element service-ips: ") && rules.contains("nft element service-ips: "),
        "{rules}"
    );
    let v4 = lab.exec("node-1", &["nft", "list", "table", "ip", "kube-proxy"]);
    assert!(v4.contains(&format!("{} . tcp . 80 : goto service-", ips[0])), "{v4}");
    // `podpath trace` of each family walks that family's table.
    let (ok, traced) = lab.run("trace", &["http://[2001:db8:100::1]/"]);
    assert!(ok, "{traced}");
    assert!(traced.contains("map service-ips element 2001:db8:100::1 . tcp . 80"), "{traced}");
    assert!(traced.contains("dnat ip6 to") && traced.contains("answered 200"), "{traced}");
    let (ok, traced) = lab.run("trace", &["http://198.51.100.1/"]);
    assert!(ok, "{traced}");
    assert!(traced.contains("map service-ips element 198.51.100.1 . tcp . 80"), "{traced}");
    assert!(traced.contains("dnat ip to") && traced.contains("answered 200"), "{traced}");
    // NetworkPolicy per family: only the IPv6 pod network may reach the web pods.
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-in}\nspec:\n  \
         podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{ipBlock: {cidr: \"fd00:10:244::/56\"}}]\n",
    );
    for url in ["http://198.51.100.1/", "http://[2001:db8:100::1]/"] {
        wait_client(&lab, url, false);
    }
    let page = lab.kubectl(&["exec", "cl", "--", "wget", "-qO-", "-T", "5", &format!("http://[{}]/", ips[1])]);
    assert!(page.contains("pod: default/web-"), "{page}");
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .args(["exec", "cl", "--", "timeout", "3", "wget", "-qO-", &format!("http://{}/", ips[0])])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the pod's IPv4 connection is not in the IPv6 ipBlock");
    let policy6 = lab.exec("node-1", &["nft", "list", "table", "ip6", "podpath-policy"]);
    assert!(policy6.contains("ip6 saddr fd00:10:244::/56 accept"), "{policy6}");
    lab.kubectl(&["delete", "networkpolicy", "web-in"]);
    // The family order is fixed once set: the real server's answer, through kubectl.
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .args(["patch", "svc", "web", "--type=merge", "-p", r#"{"spec":{"ipFamilies":["IPv6","IPv4"]}}"#])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "The Service \"web\" is invalid: \n* spec.clusterIPs[0]: Invalid value: \"{}\": expected an IPv6 value as indicated by `ipFamilies[0]`",
            ips[0]
        )),
        "{err}"
    );
    drop(lab);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// The gateway's proxies over IPv6 (`--lb-mode nodeport`): a LoadBalancer IP proxied to the
/// nodes' IPv6 NodePorts (served by the nodes' userspace proxies), and an Ingress served by the
/// L7 proxy with `X-Forwarded-For` in the IPv6 form.
#[test]
fn an_ipv6_lab_proxies_load_balancers_and_ingresses() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    // The nodes in the userspace mode: its proxy sockets and held NodePorts on `[::]`.
    let lab =
        Lab::up("v6p", &["--nodes", "2", "--ip-family", "ipv6", "--lb-mode", "nodeport", "--proxy-mode", "userspace"])
            .expect("podpath up --ip-family ipv6 --lb-mode nodeport --proxy-mode userspace");
    lab.apply(WEB);
    lab.apply(&service("SingleStack"));
    lab.kubectl(&["create", "ingress", "web", "--rule=/*=web:80"]);
    lab.kubectl(&["rollout", "status", "deploy/web", "--timeout=60s"]);
    wait_endpoints(&lab, "IPv6");
    assert_eq!(lab.lb_ip("web"), "2001:db8:100::1");
    both_pods_answer(&lab, "http://[2001:db8:100::1]/");
    // The trace follows the request through both relays: its DSCP in the traffic class.
    let (ok, traced) = lab.run("trace", &["http://[2001:db8:100::1]/"]);
    assert!(ok, "{traced}");
    assert!(traced.contains("lb-sim (nodeport LB of default/web) accepted on [2001:db8:100::1]:80"), "{traced}");
    assert!(traced.contains("node-agent's userspace proxy for default/web accepted on [fd00:56::1"), "{traced}");
    assert!(traced.contains("answered 200"), "{traced}");
    let ingress = lab.kubectl_until(
        Duration::from_secs(30),
        &["get", "ingress", "web", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"],
        |o| !o.is_empty(),
    );
    assert_eq!(ingress, "2001:db8:100::2");
    let page = wait_for(Duration::from_secs(20), "the Ingress to answer", || {
        let (code, out) = lab.curl(&["-g", "http://[2001:db8:100::2]/"]);
        if code == 0 && out.contains("pod: default/web-") {
            Ok(out)
        } else {
            Err(out)
        }
    });
    assert!(page.contains("x-forwarded-for: 2001:db8:113::10, 2001:db8:100::2"), "{page}");
    let lo = lab.exec("gateway", &["ip", "-6", "address", "show", "dev", "lo"]);
    assert!(lo.contains("inet6 2001:db8:100::1/128 scope global nodad noprefixroute"), "{lo}");
    drop(lab);
    assert_eq!(host_state(), before, "the host namespace changed");
}
