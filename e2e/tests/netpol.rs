//! NetworkPolicy enforcement end to end, over the upstream netpol suite's world: a two-node
//! lab, namespaces x, y, z with pods a, b, c each serving TCP and UDP on 80 and 81, every case
//! of `netpol/testdata/netpol-cases.yaml` applied with kubectl and probed with `podpath
//! policy matrix` (real connections between real pods, same node and across nodes); the
//! expected matrix comes from the pure model (`api::netpol`), never from podpath's output.
//! Root only (CI runs as root).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use api::k8s_openapi::api::networking::v1::NetworkPolicy;
use api::netpol::{self, End, Pod};
use podpath_e2e::{wait_for, Lab};
use testkit::netns::{host_state, root_or_explain};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];

/// The world as YAML (namespace names quoted: YAML 1.1 readers take a bare `y` for true).
fn world_yaml() -> String {
    let mut docs = vec![];
    for ns in NAMESPACES {
        docs.push(format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: \"{ns}\", labels: {{ns: \"{ns}\"}}}}"));
        for pod in PODS {
            let ports: Vec<String> = [80, 81]
                .iter()
                .flat_map(|p| {
                    ["TCP", "UDP"].map(|pr| {
                        format!("{{name: serve-{p}-{}, containerPort: {p}, protocol: {pr}}}", pr.to_lowercase())
                    })
                })
                .collect();
            docs.push(format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: \"{ns}\", labels: {{pod: {pod}}}}}\n\
                 spec: {{containers: [{{name: c, image: podpath/echo, ports: [{}]}}]}}",
                ports.join(", ")
            ));
        }
    }
    docs.join("\n---\n")
}

/// The pods as the model sees them, read back from the API (addresses, labels, namespace labels).
fn model_world(lab: &Lab) -> Vec<Pod> {
    let pods: serde_json::Value = serde_json::from_str(&lab.kubectl(&["get", "pods", "-A", "-o", "json"])).unwrap();
    let nss: serde_json::Value = serde_json::from_str(&lab.kubectl(&["get", "ns", "-o", "json"])).unwrap();
    let labels = |v: &serde_json::Value| -> BTreeMap<String, String> {
        serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
    };
    let ns_labels: BTreeMap<String, BTreeMap<String, String>> = nss["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["metadata"]["name"].as_str().unwrap().to_string(), labels(n)))
        .collect();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| NAMESPACES.contains(&p["metadata"]["namespace"].as_str().unwrap()))
        .map(|p| {
            let ns = p["metadata"]["namespace"].as_str().unwrap().to_string();
            Pod {
                name: p["metadata"]["name"].as_str().unwrap().to_string(),
                labels: labels(p),
                namespace_labels: ns_labels[&ns].clone(),
                namespace: ns,
                ip: p["status"]["podIP"].as_str().unwrap().parse().unwrap(),
                named_ports: p["spec"]["containers"][0]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|cp| {
                        (
                            cp["name"].as_str().unwrap().to_string(),
                            cp["containerPort"].as_u64().unwrap() as u16,
                            cp["protocol"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The catalogue, placeholders filled with this lab's addresses.
fn cases(pods: &[Pod]) -> Vec<(String, Vec<serde_json::Value>)> {
    let mut text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../netpol/testdata/netpol-cases.yaml"))
            .expect("the cases file");
    text = text.replace("{pods}", "10.244.0.0/16");
    for p in pods {
        text = text.replace(&format!("{{ip:{}/{}}}", p.namespace, p.name), &p.ip.to_string());
    }
    let raw: Vec<serde_json::Value> = serde_yaml::from_str(&text).unwrap();
    raw.into_iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["policies"].as_array().unwrap().clone()))
        .collect()
}

type Matrices = BTreeMap<String, BTreeMap<String, BTreeMap<String, bool>>>;

/// What the model expects: a pod always reaches itself (its own address never leaves it: the
/// upstream suite's `AllowLoopback`).
fn expected(pods: &[Pod], policies: &[NetworkPolicy]) -> Matrices {
    let mut m = Matrices::new();
    for (proto, port) in [("tcp", 80u16), ("tcp", 81), ("udp", 80), ("udp", 81)] {
        let table = m.entry(format!("{proto}/{port}")).or_default();
        for from in pods {
            for to in pods {
                let ok = std::ptr::eq(from, to)
                    || netpol::connection(policies, &End::Pod(from), &End::Pod(to), port, &proto.to_uppercase())
                        .allowed();
                table
                    .entry(format!("{}/{}", from.namespace, from.name))
                    .or_default()
                    .insert(format!("{}/{}", to.namespace, to.name), ok);
            }
        }
    }
    m
}

fn probe(lab: &Lab) -> Matrices {
    let (ok, out) = lab.run(
        "policy",
        &[
            "matrix",
            "--namespaces",
            "x,y,z",
            "--ports",
            "80,81",
            "--protocols",
            "tcp,udp",
            "--timeout-ms",
            "300",
            "-o",
            "json",
        ],
    );
    assert!(ok, "podpath policy matrix: {out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    serde_json::from_value(v["results"].clone()).unwrap()
}

/// The cells where `got` differs from `want`, as `tcp/80 x/a→y/b: want . got X`.
fn differences(want: &Matrices, got: &Matrices) -> Vec<String> {
    let mut out = vec![];
    for (table, rows) in want {
        for (from, cols) in rows {
            for (to, w) in cols {
                let g = got.get(table).and_then(|r| r.get(from)).and_then(|c| c.get(to));
                if g != Some(w) {
                    let mark = |b: Option<&bool>| match b {
                        Some(true) => ".",
                        Some(false) => "X",
                        None => "?",
                    };
                    out.push(format!("{table} {from}→{to}: want {} got {}", mark(Some(w)), mark(g)));
                }
            }
        }
    }
    out
}

fn delete_policies(lab: &Lab) {
    for ns in NAMESPACES {
        lab.kubectl(&["delete", "networkpolicy", "--all", "-n", ns, "--wait=false"]);
    }
}

fn to_policy(v: &serde_json::Value) -> NetworkPolicy {
    let mut p: NetworkPolicy = serde_json::from_value(v.clone()).unwrap();
    api::ApiObject::apply_defaults(&mut p);
    p
}

/// iptables mode: the policy chains in the filter table (iptables-nft, the default backend).
#[test]
fn policies_are_enforced_as_the_model_decides_in_iptables_mode() {
    every_case("iptables");
}

/// nftables mode: the table `ip podpath-policy`.
#[test]
fn policies_are_enforced_as_the_model_decides_in_nftables_mode() {
    every_case("nftables");
}

fn every_case(mode: &str) {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let lab = Lab::up("netpol", &["--nodes", "2", "--proxy-mode", mode]).unwrap();
    lab.apply(&world_yaml());
    for ns in NAMESPACES {
        lab.kubectl(&["wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=60s"]);
    }
    let pods = model_world(&lab);
    assert_eq!(pods.len(), 9);
    let nodes: std::collections::BTreeSet<String> =
        serde_json::from_str::<serde_json::Value>(&lab.kubectl(&["get", "pods", "-A", "-o", "json"])).unwrap()["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
            .collect();
    assert_eq!(nodes.len(), 2, "the world spans both nodes, so same-node and cross-node pairs are probed");

    // Without policies everyone reaches everyone (the same-bridge path is routed, not lost).
    let all_open = expected(&pods, &[]);
    let got = probe(&lab);
    assert!(differences(&all_open, &got).is_empty(), "{:?}", differences(&all_open, &got));

    let mut took = vec![];
    let cases = cases(&pods);
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for (name, docs) in &cases {
        let policies: Vec<NetworkPolicy> = docs.iter().map(to_policy).collect();
        let want = expected(&pods, &policies);
        let t = Instant::now();
        let objects: Vec<String> = docs
            .iter()
            .map(|d| {
                let mut d = d.clone();
                d["apiVersion"] = "networking.k8s.io/v1".into();
                d["kind"] = "NetworkPolicy".into();
                d.to_string()
            })
            .collect();
        // A YAML stream of JSON documents (a leading `---` keeps kubectl from reading it as one
        // JSON document).
        lab.apply(&format!("---\n{}", objects.join("\n---\n")));
        wait_for(Duration::from_secs(10), &format!("case {name}"), || {
            let diff = differences(&want, &probe(&lab));
            if diff.is_empty() {
                Ok(())
            } else {
                Err(diff.join("\n"))
            }
        });
        took.push((name.clone(), t.elapsed()));
        delete_policies(&lab);
    }
    eprintln!("{mode} mode: cases and time to the expected matrix: {took:?}");

    // Back to open once every policy is gone.
    wait_for(Duration::from_secs(10), "every pair open again", || {
        let diff = differences(&all_open, &probe(&lab));
        if diff.is_empty() {
            Ok(())
        } else {
            Err(diff.join("\n"))
        }
    });

    // Through a Service: the policy sees the pod after DNAT. Every pod calls x/a's ClusterIP
    // (the pods on x/a's node take the node's own hairpin path); with x/a taking ingress from
    // `pod: b` only, exactly the b pods get through, as the model says of the pod itself.
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: svc-a, namespace: \"x\"}\n\
         spec: {selector: {pod: a}, ports: [{port: 8000, targetPort: 80}]}",
    );
    let vip = lab.kubectl(&["get", "svc", "svc-a", "-n", "x", "-o", "jsonpath={.spec.clusterIP}"]);
    let via_service = |from: &Pod| {
        let (ok, out) = lab.run(
            "exec",
            &[
                &format!("pod/{}/{}", from.namespace, from.name),
                "--",
                "curl",
                "-sS",
                "-m",
                "1",
                &format!("http://{vip}:8000/"),
            ],
        );
        ok && out.contains("pod: x/a")
    };
    wait_for(Duration::from_secs(10), "x/a's endpoint", || {
        let failed: Vec<String> =
            pods.iter().filter(|p| !via_service(p)).map(|p| format!("{}/{}", p.namespace, p.name)).collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("no answer through the ClusterIP from {failed:?}"))
        }
    });
    let from_b = to_policy(&serde_json::json!({
        "metadata": {"name": "a-from-b", "namespace": "x"},
        "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}, "namespaceSelector": {}}]}]}
    }));
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a-from-b, namespace: \"x\"}\n\
         spec: {podSelector: {matchLabels: {pod: a}}, ingress: [{from: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {}}]}]}",
    );
    let xa = pods.iter().find(|p| p.namespace == "x" && p.name == "a").unwrap();
    wait_for(Duration::from_secs(10), "the ClusterIP as the policy says", || {
        let wrong: Vec<String> = pods
            .iter()
            .filter(|p| !std::ptr::eq(*p, xa))
            .filter(|p| {
                let want =
                    netpol::connection(std::slice::from_ref(&from_b), &End::Pod(p), &End::Pod(xa), 80, "TCP").allowed();
                via_service(p) != want
            })
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("through the ClusterIP, wrong for {wrong:?}"))
        }
    });
    drop(lab);
    assert_eq!(host_state(), before, "the host's network namespace changed");
}

/// A label changed while probing moves a pod into a peer set; a connection established before a
/// deny-all keeps working (conntrack) while new ones are dropped; DNS keeps resolving under a
/// policy that allows egress to kube-system on 53 only, and stops under deny-all egress.
#[test]
fn label_updates_established_connections_and_dns_egress() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("netpol2", &["--nodes", "2"]).unwrap();
    lab.apply(&world_yaml());
    for ns in NAMESPACES {
        lab.kubectl(&["wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=60s"]);
    }
    lab.wait_for_cluster_dns();
    let ip = |id: &str| {
        let (ns, name) = id.split_once('/').unwrap();
        lab.kubectl(&["get", "pod", name, "-n", ns, "-o", "jsonpath={.status.podIP}"])
    };
    let reaches = |from: &str, to: &str| -> bool {
        let (ok, out) = lab.run(
            "exec",
            &[&format!("pod/{from}"), "--", "curl", "-sS", "--max-time", "1", &format!("http://{}:80/", ip(to))],
        );
        ok && out.contains("pod:")
    };

    // x/a takes ingress from `pod: b` only; x/c becomes a b while probing.
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-b, namespace: x}\n\
         spec: {podSelector: {matchLabels: {pod: a}}, ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]}",
    );
    wait_for(
        Duration::from_secs(5),
        "x/c denied",
        || if reaches("x/c", "x/a") { Err("allowed".into()) } else { Ok(()) },
    );
    // The trace names the drop and the isolating policy; explain shows what the policy admits.
    let url = format!("http://{}:80/", ip("x/a"));
    let (ok, out) = lab.run("trace", &["--from", "pod/x/c", "--timeout", "1", &url]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("dropped: no policy selecting pod x/a allows ingress from pod x/c")
            && out.contains("isolated by x/from-b"),
        "{out}"
    );
    let (ok, out) = lab.run("explain", &["networkpolicy", "x/from-b"]);
    assert!(ok, "{out}");
    for want in ["NetworkPolicy x/from-b (policyTypes: Ingress)", "selects: x/a (", "ingress[0]: from[0]: x/b"] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(out.contains("x/from-b ingress[0] from[0]") && out.contains("isolated by x/from-b"), "{out}");
    let t = Instant::now();
    lab.kubectl(&["label", "pod", "c", "-n", "x", "pod=b", "--overwrite"]);
    wait_for(Duration::from_secs(5), "x/c allowed after its label change", || {
        if reaches("x/c", "x/a") {
            Ok(())
        } else {
            Err("denied".into())
        }
    });
    eprintln!("label change → allowed in {:?}", t.elapsed());
    let (ok, out) = lab.run("trace", &["--from", "pod/x/c", "--timeout", "2", &url]);
    assert!(ok, "{out}");
    assert!(
        out.contains("NetworkPolicy allows ingress from pod x/c") && out.contains("x/from-b ingress[0] from[0]"),
        "{out}"
    );
    lab.kubectl(&["delete", "networkpolicy", "from-b", "-n", "x"]);

    // A keep-alive connection from y/a to x/a made before a deny-all of x keeps answering.
    let lab_state = podpath_lab::load_state(&lab.state).unwrap().unwrap();
    let ya_pid =
        podpath_lab::hosts::pod_pid(&lab_state, &podpath_lab::state::ApiAccess::of(&lab_state).unwrap(), "y", "a")
            .unwrap();
    let target: std::net::SocketAddr = format!("{}:80", ip("x/a")).parse().unwrap();
    let (to_main, from_main) = std::sync::mpsc::channel::<()>();
    let (to_test, answers) = std::sync::mpsc::channel::<bool>();
    let conn = std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{ya_pid}/ns/net")).unwrap();
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut s = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        for _ in 0..2 {
            let ok = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").is_ok() && {
                let mut buf = [0u8; 4096];
                matches!(s.read(&mut buf), Ok(n) if n > 0 && buf[..n].starts_with(b"HTTP/1.1 200"))
            };
            to_test.send(ok).unwrap();
            let _ = from_main.recv();
        }
    });
    assert!(answers.recv().unwrap(), "first request on the kept connection");
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: x}\n\
         spec: {podSelector: {}, policyTypes: [Ingress]}",
    );
    wait_for(Duration::from_secs(5), "new connections to x/a dropped", || {
        if reaches("y/a", "x/a") {
            Err("allowed".into())
        } else {
            Ok(())
        }
    });
    to_main.send(()).unwrap();
    assert!(answers.recv().unwrap(), "the connection made before the deny-all still answers");
    to_main.send(()).unwrap();
    conn.join().unwrap();
    lab.kubectl(&["delete", "networkpolicy", "deny-all", "-n", "x"]);

    // DNS egress: allowed to kube-system on 53 → names resolve; deny-all egress → they do not.
    let resolves = || {
        let (ok, out) = lab.run(
            "exec",
            &["pod/x/b", "--", "dig", "+short", "+time=1", "+tries=1", "kube-dns.kube-system.svc.cluster.local"],
        );
        ok && out.contains("10.96.0.10")
    };
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: dns-only, namespace: x}\n\
         spec:\n  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n  - to: [{namespaceSelector: {matchLabels: \
         {kubernetes.io/metadata.name: kube-system}}}]\n    ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]",
    );
    wait_for(Duration::from_secs(5), "egress to y dropped under dns-only", || {
        if reaches("x/b", "y/b") {
            Err("allowed".into())
        } else {
            Ok(())
        }
    });
    assert!(resolves(), "DNS resolves under a policy allowing egress to kube-system:53");
    lab.kubectl(&["delete", "networkpolicy", "dns-only", "-n", "x"]);
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-egress, namespace: x}\n\
         spec: {podSelector: {}, policyTypes: [Egress]}",
    );
    wait_for(Duration::from_secs(5), "DNS blocked by deny-all egress", || {
        if resolves() {
            Err("resolved".into())
        } else {
            Ok(())
        }
    });
}

/// From outside the cluster through a NodePort: on the pod's own node the policy sees the
/// external client's address (the masquerade comes after the forward hook), so an ipBlock of
/// the client's network lets it in and a deny-all keeps it out — as in real clusters.
#[test]
fn a_nodeport_from_outside_meets_the_policy_with_the_clients_address() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("netpol3", &["--nodes", "2"]).unwrap();
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, labels: {app: web}}\nspec:\n  nodeName: node-1\n  \
         containers:\n  - {name: main, image: podpath/echo, ports: [{containerPort: 8080}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: NodePort\n  selector: {app: web}\n  \
         ports:\n  - {port: 80, targetPort: 8080}\n",
    );
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    let np = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let url = format!("http://192.168.56.11:{np}/");
    let answers = || {
        let (code, out) = lab.curl(&["-m", "2", &url]);
        code == 0 && out.contains("pod: default/web")
    };
    wait_for(Duration::from_secs(10), "the NodePort from the client", || {
        if answers() {
            Ok(())
        } else {
            Err("no".into())
        }
    });
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all}\n\
         spec: {podSelector: {}, policyTypes: [Ingress]}",
    );
    wait_for(
        Duration::from_secs(10),
        "the client kept out",
        || if answers() { Err("answered".into()) } else { Ok(()) },
    );
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-the-internet}\n\
         spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{ipBlock: {cidr: 203.0.113.0/24}}]}]}",
    );
    wait_for(Duration::from_secs(10), "the client let in by its network", || {
        if answers() {
            Ok(())
        } else {
            Err("no".into())
        }
    });
    // The trace names the rule: the client's address, as the pod's node saw it.
    let (ok, out) = lab.run("trace", &["--timeout", "2", &url]);
    assert!(ok, "{out}");
    assert!(
        out.contains("NetworkPolicy allows ingress from")
            && out.contains("default/from-the-internet ingress[0] from[0]"),
        "{out}"
    );
}
