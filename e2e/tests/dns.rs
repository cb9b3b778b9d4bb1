//! `podpath-dns` as a process against a real API server: Services made with kubectl appear
//! in the zone, their changes follow, their deletion takes them out; bad flags are refused.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use podpath_e2e::{bin, free_port, http_get, wait_for, ApiServer};

struct Dns(Child);

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ask(addr: SocketAddr, name: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.id = 7;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    let s = UdpSocket::bind(if addr.ip().is_loopback() { "127.0.0.1:0" } else { "0.0.0.0:0" }).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.send_to(&m.to_vec().unwrap(), addr).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.recv(&mut buf).expect("an answer within 2 s");
    Message::from_vec(&buf[..n]).unwrap()
}

/// [`ask`], a missing answer an error (a query forwarded to an unreachable upstream takes 5 s).
fn try_ask(addr: SocketAddr, name: &str, t: RecordType) -> Result<Message, String> {
    let mut m = Message::query();
    m.metadata.id = 8;
    m.add_query(Query::query(Name::from_ascii(name).map_err(|e| e.to_string())?, t));
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.send_to(&m.to_vec().map_err(|e| e.to_string())?, addr).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    let n = s.recv(&mut buf).map_err(|e| format!("no answer: {e}"))?;
    Message::from_vec(&buf[..n]).map_err(|e| e.to_string())
}

fn ok(api: &ApiServer, args: &[&str]) -> String {
    let o = api.kubectl(args);
    assert!(o.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn services_made_with_kubectl_are_answered_and_follow_changes() {
    let api = ApiServer::start(&[]).unwrap();
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let side: Vec<SocketAddr> = (0..3).map(|_| format!("127.0.0.1:{}", free_port()).parse().unwrap()).collect();
    let log = std::fs::File::create(api.dir.path().join("dns.log")).unwrap();
    let child = Command::new(bin("podpath-dns"))
        .args(["--apiserver", &api.grpc.to_string(), "--listen", &addr.to_string()])
        .args(["--metrics-listen", &side[0].to_string(), "--health-listen", &side[1].to_string()])
        .args(["--ready-listen", &side[2].to_string()])
        .arg("--token-file")
        .arg(api.dir.path().join("token"))
        .arg("--apiserver-ca-file")
        .arg(api.data_dir.join("pki/ca.crt"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let _dns = Dns(child);
    // The API server's own Service is there from the start.
    let kubernetes = wait_for(Duration::from_secs(20), "podpath-dns answers", || {
        std::panic::catch_unwind(|| ask(addr, "kubernetes.default.svc.cluster.local.", RecordType::A))
            .map_err(|_| "no answer yet".to_string())
    });
    assert_eq!(kubernetes.metadata.response_code, ResponseCode::NoError);
    assert_eq!(kubernetes.answers.len(), 1);
    ok(&api, &["create", "service", "clusterip", "web", "--tcp=80:8080"]);
    let ip = ok(&api, &["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let answer = wait_for(Duration::from_secs(5), "web in the zone", || {
        let m = ask(addr, "web.default.svc.cluster.local.", RecordType::A);
        if m.answers.is_empty() {
            Err(format!("{:?}", m.metadata.response_code))
        } else {
            Ok(m)
        }
    });
    assert_eq!(answer.answers[0].to_string(), format!("web.default.svc.cluster.local. 30 IN A {ip}"));
    // kubectl names the port 80-8080: its SRV record.
    let srv = ask(addr, "_80-8080._tcp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(srv.answers.len(), 1, "{srv:?}");
    ok(&api, &["delete", "service", "web"]);
    wait_for(Duration::from_secs(5), "web gone", || {
        let code = ask(addr, "web.default.svc.cluster.local.", RecordType::A).metadata.response_code;
        if code == ResponseCode::NXDomain {
            Ok(())
        } else {
            Err(format!("{code:?}"))
        }
    });
    assert_eq!(ask(addr, "example.com.", RecordType::A).metadata.response_code, ResponseCode::Refused);
    // CoreDNS's endpoints: its metric names, health and readiness.
    let (code, metrics) = http_get(side[0], "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("proto=\"udp\",family=\"1\",type=\"SRV\"} 1\n"), "{metrics}");
    assert!(metrics.contains("rcode=\"REFUSED\"} 1\n"), "{metrics}");
    assert_eq!(http_get(side[1], "/health").unwrap(), (200, "OK".to_string()));
    assert_eq!(http_get(side[2], "/ready").unwrap(), (200, "OK".to_string()));
}

#[test]
fn bad_flags_are_refused_with_a_message() {
    let o = Command::new(bin("podpath-dns")).args(["--ttl", "5000"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("5000 is not in 0..=3600"), "{o:?}");
    let o = Command::new(bin("podpath-dns")).args(["--cluster-domain", "bad..domain"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid cluster domain \"bad..domain\""), "{o:?}");
    let o = Command::new(bin("podpath-dns")).args(["--metrics-listen", "nope"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--metrics-listen \"nope\" is not an address:port"), "{o:?}");
}

/// Starts `podpath-dns --conf FILE` against `api` on `addr`, stdout to `out`.
fn with_corefile(api: &ApiServer, addr: SocketAddr, corefile: &std::path::Path, out: &std::path::Path) -> Dns {
    Dns(spawn_with_corefile(api, addr, corefile, out))
}

fn spawn_with_corefile(api: &ApiServer, addr: SocketAddr, corefile: &std::path::Path, out: &std::path::Path) -> Child {
    Command::new(bin("podpath-dns"))
        .args(["--apiserver", &api.grpc.to_string(), "--listen", &addr.to_string()])
        .arg("--conf")
        .arg(corefile)
        .arg("--token-file")
        .arg(api.dir.path().join("token"))
        .arg("--apiserver-ca-file")
        .arg(api.data_dir.join("pki/ca.crt"))
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// A Corefile file, as CoreDNS's `-conf`: `reload` picks up an edit that adds `log` (the
/// queries are printed in CoreDNS's format from then on), a broken edit is logged as CoreDNS
/// logs it and the running Corefile keeps answering; a bad Corefile at start ends the process
/// with the parse error; a `forward` back to the server itself is the `loop` plugin's fatal loop.
#[test]
fn a_corefile_is_reloaded_and_bad_ones_are_refused() {
    let api = ApiServer::start(&[]).unwrap();
    let dir = api.dir.path();
    let (conf, out) = (dir.join("Corefile"), dir.join("dns.out"));
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let base = "cluster.local {\n    errors\n    kubernetes\n    reload 2s\n}\n";
    std::fs::write(&conf, base).unwrap();
    let _dns = with_corefile(&api, addr, &conf, &out);
    let q = "kubernetes.default.svc.cluster.local.";
    let first = wait_for(Duration::from_secs(20), "podpath-dns answers", || {
        std::panic::catch_unwind(|| ask(addr, q, RecordType::A)).map_err(|_| "no answer yet".to_string())
    });
    assert_eq!(first.answers[0].to_string(), format!("{q} 5 IN A 10.96.0.1"), "the kubernetes plugin's default TTL");
    let printed = || std::fs::read_to_string(&out).unwrap();
    assert!(printed().contains("[INFO] plugin/reload: Running configuration SHA512 = "), "{}", printed());
    assert!(!printed().contains(" IN kubernetes"), "no log plugin yet: {}", printed());
    std::fs::write(&conf, base.replace("    errors\n", "    errors\n    log\n")).unwrap();
    let line = wait_for(Duration::from_secs(10), "the log plugin's line", || {
        ask(addr, q, RecordType::A);
        printed().lines().find(|l| l.contains("\"A IN kubernetes.default")).map(str::to_string).ok_or_else(printed)
    });
    assert!(line.starts_with("[INFO] 127.0.0.1:"), "{line}");
    assert!(line.contains(&format!(" - 7 \"A IN {q} udp ")) && line.contains(" NOERROR qr,aa "), "{line}");
    assert!(printed().contains("[INFO] Reloading\n") && printed().contains("[INFO] Reloading complete\n"));
    // A directive CoreDNS does not know: logged, the running Corefile kept.
    std::fs::write(&conf, base.replace("    errors\n", "    errors\n    bogus\n")).unwrap();
    wait_for(Duration::from_secs(10), "the failed reload", || {
        printed()
            .contains("[ERROR] Restart failed: Corefile:3 - Error during parsing: Unknown directive 'bogus'\n")
            .then_some(())
            .ok_or_else(printed)
    });
    assert!(printed().contains(
        "[ERROR] plugin/reload: Corefile changed but reload failed: starting with listener file descriptors: Corefile:3 - Error during parsing: Unknown directive 'bogus'"
    ));
    assert_eq!(ask(addr, q, RecordType::A).answers.len(), 1, "still answering with the Corefile before");

    // At start, a bad Corefile is the end (as CoreDNS exits), with the parse error.
    std::fs::write(dir.join("bad"), ".:53 {\n    forward . nowhere\n}\n").unwrap();
    let o = Command::new(bin("podpath-dns"))
        .args(["--apiserver", &api.grpc.to_string(), "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--conf")
        .arg(dir.join("bad"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("Corefile:2 - Error during parsing: plugin/forward: not an IP address or file: \"nowhere\""),
        "{e}"
    );
    // Forwarding to itself: the loop plugin's probe comes back, the process exits.
    let lport = free_port();
    std::fs::write(dir.join("loop"), format!(".:{lport} {{\n    forward . 127.0.0.1:{lport}\n    loop\n}}\n")).unwrap();
    let looped = spawn_with_corefile(
        &api,
        format!("127.0.0.1:{lport}").parse().unwrap(),
        &dir.join("loop"),
        &dir.join("loop.out"),
    );
    let o = podpath_e2e::wait_bounded(looped, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1));
    let said = std::fs::read_to_string(dir.join("loop.out")).unwrap();
    assert!(
        said.contains(&format!("[FATAL] plugin/loop: Loop (127.0.0.1:{lport} -> :{lport}) detected for zone \".\"")),
        "{said}"
    );
}

/// "Debugging DNS Resolution" and "Customizing DNS Service", as written: the lab's DNS runs the
/// Corefile of `kube-system/coredns`; `kubectl edit` adding `log` and a stub domain takes effect
/// within seconds (queries appear in the DNS pods' logs; names of the stub domain are forwarded
/// to a DNS server in a pod of a test namespace); an edit with an unknown plugin is logged as
/// CoreDNS logs it and changes nothing; no DNS pod restarts.
#[test]
fn the_coredns_configmap_configures_the_cluster_dns() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    let lab = podpath_e2e::Lab::up("corefile", &["--nodes", "1"]).unwrap();
    let corefile =
        lab.kubectl(&["get", "configmap", "coredns", "-n", "kube-system", "-o", "jsonpath={.data.Corefile}"]);
    assert!(
        corefile.starts_with(".:53 {\n    errors\n") && corefile.contains("forward . /etc/resolv.conf"),
        "{corefile}"
    );
    // The upstream of the stub domain: podpath-dns in a pod of its own, serving `example.test`
    // (its own Corefile, a file on the node: process pods see the node's files).
    let dir = tempfile::tempdir().unwrap();
    let upstream_conf = dir.path().join("Corefile");
    std::fs::write(&upstream_conf, "example.test {\n    kubernetes\n    log\n}\n").unwrap();
    lab.kubectl(&["create", "namespace", "dns-upstream"]);
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: upstream, namespace: dns-upstream}}\nspec:\n  containers:\n  - name: dns\n    image: podpath/dns\n    args: [--conf, {}]\n",
        upstream_conf.display()
    ));
    lab.kubectl(&["wait", "-n", "dns-upstream", "--for=condition=Ready", "pod/upstream", "--timeout=60s"]);
    let upstream_ip = lab.kubectl(&["get", "pod", "upstream", "-n", "dns-upstream", "-o", "jsonpath={.status.podIP}"]);
    let dns: SocketAddr = "10.96.0.10:53".parse().unwrap();
    let stub = "kubernetes.default.svc.example.test.";
    // `kubectl -n kube-system edit configmap coredns`, the editor adding `log` and a stub block.
    let editor = dir.path().join("editor.sh");
    let edit = |script: &str| {
        std::fs::write(&editor, format!("#!/bin/sh\nset -e\n{script}\n")).unwrap();
        std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&lab.kubeconfig)
            .args(["-n", "kube-system", "edit", "configmap", "coredns"])
            .env("KUBE_EDITOR", &editor)
            .output()
            .unwrap();
        assert!(out.status.success(), "kubectl edit: {}", String::from_utf8_lossy(&out.stderr));
    };
    // The Corefile is a block scalar in the YAML kubectl edits: `errors` gains a `log` after it,
    // the closing brace of `.:53` (at the scalar's indentation) a stub block after it.
    edit(&format!(
        r#"sed -i -e 's/^\( *\)errors$/\1errors\n\1log/' -e 's/^    }}$/    }}\n    example.test:53 {{\n        errors\n        forward . {upstream_ip}\n    }}/' "$1""#
    ));
    let edited = lab.kubectl(&["get", "configmap", "coredns", "-n", "kube-system", "-o", "jsonpath={.data.Corefile}"]);
    assert!(edited.contains("    errors\n    log\n") && edited.contains("example.test:53 {"), "{edited}");
    // Within seconds (reload 2s), the stub domain answers through the upstream pod …
    let answer = wait_for(Duration::from_secs(15), "the stub domain forwarded", || {
        let m = lab.in_netns("node-1", move || try_ask(dns, stub, RecordType::A))?;
        if m.answers.is_empty() {
            Err(format!("{:?}", m.metadata.response_code))
        } else {
            Ok(m)
        }
    });
    assert_eq!(answer.answers[0].to_string(), format!("{stub} 5 IN A 10.96.0.1"));
    assert!(answer.metadata.authoritative, "the upstream is authoritative for it: forward passes its flags");
    // … and the queries of the block with `log` appear in the DNS pods' logs, in CoreDNS's
    // format (the stub block has no `log`: its queries are not there).
    let cluster = "kubernetes.default.svc.cluster.local.";
    let logs = lab.kubectl_until(
        Duration::from_secs(15),
        &["logs", "-n", "kube-system", "-l", "k8s-app=kube-dns", "--tail=-1"],
        |l| {
            let _ = lab.in_netns("node-1", move || try_ask(dns, cluster, RecordType::A));
            l.contains("\"A IN kubernetes.default.svc.cluster.local. udp ")
        },
    );
    assert!(!logs.contains("IN kubernetes.default.svc.example.test."), "{logs}");
    assert!(logs.contains("[INFO] Reloading complete"), "{logs}");
    let up_logs = lab.kubectl(&["logs", "-n", "dns-upstream", "upstream"]);
    assert!(
        up_logs.contains("\"A IN kubernetes.default.svc.example.test. udp ") && up_logs.contains(" NOERROR qr,aa "),
        "{up_logs}"
    );

    // An unknown plugin: logged as CoreDNS logs a failed reload; the DNS keeps the Corefile it had.
    edit(r#"sed -i -e 's/^\( *\)log$/\1log\n\1bogus/' "$1""#);
    let logs = lab.kubectl_until(
        Duration::from_secs(15),
        &["logs", "-n", "kube-system", "-l", "k8s-app=kube-dns", "--tail=-1"],
        |l| l.contains("[ERROR] Restart failed: Corefile:4 - Error during parsing: Unknown directive 'bogus'"),
    );
    assert!(logs.contains("[ERROR] plugin/reload: Corefile changed but reload failed"), "{logs}");
    // Up to three tries of 2 s, as a resolver retries a lost UDP query (glibc: attempts 2).
    let again = (0..3)
        .find_map(|_| lab.in_netns("node-1", move || try_ask(dns, stub, RecordType::A)).ok())
        .expect("the stub domain answered within three tries");
    assert_eq!(again.answers.len(), 1, "the running Corefile still forwards the stub domain");
    let restarts = lab.cluster_dns_pods("{.items[*].status.containerStatuses[0].restartCount}");
    assert!(restarts.split_whitespace().all(|r| r == "0"), "no DNS pod restarted: {restarts}");
    lab.kubectl(&["delete", "namespace", "dns-upstream", "--wait=false"]);
}

/// In a lab: `podpath up` runs the cluster DNS as kubeadm runs CoreDNS, and a query to
/// 10.96.0.10 from a node goes through the node's service proxy to a DNS pod, over UDP and TCP.
#[test]
fn the_lab_serves_cluster_dns_behind_the_kube_dns_service() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    let host_files = || ["/etc/resolv.conf", "/etc/hosts"].map(|f| std::fs::read(f).unwrap_or_default());
    let before = host_files();
    let lab = podpath_e2e::Lab::up("dnslab", &["--nodes", "2"]).unwrap();
    lab.wait_for_cluster_dns();
    let endpoints = lab.kubectl(&[
        "get",
        "endpointslices",
        "-n",
        "kube-system",
        "-l",
        "kubernetes.io/service-name=kube-dns",
        "-o",
        "jsonpath={.items[*].endpoints[*].addresses[0]}",
    ]);
    assert_eq!(endpoints.split_whitespace().count(), 2, "two DNS pods behind kube-dns: {endpoints}");
    lab.kubectl(&["create", "service", "clusterip", "web", "--tcp=80:8080"]);
    let web_ip = lab.kubectl(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let answers = lab.in_netns("node-1", move || {
        let dns: SocketAddr = "10.96.0.10:53".parse().unwrap();
        let api = ask(dns, "kubernetes.default.svc.cluster.local.", RecordType::A);
        let web = wait_for(Duration::from_secs(5), "web in the zone", || {
            let m = ask(dns, "web.default.svc.cluster.local.", RecordType::A);
            if m.answers.is_empty() {
                Err(format!("{:?}", m.metadata.response_code))
            } else {
                Ok(m)
            }
        });
        // TCP, through the Service's 53/TCP port.
        let mut q = Message::query();
        q.metadata.id = 9;
        q.add_query(Query::query(Name::from_ascii("kube-dns.kube-system.svc.cluster.local.").unwrap(), RecordType::A));
        let q = q.to_vec().unwrap();
        let mut s = std::net::TcpStream::connect_timeout(&dns, Duration::from_secs(3)).unwrap();
        use std::io::{Read, Write};
        s.write_all(&(q.len() as u16).to_be_bytes()).unwrap();
        s.write_all(&q).unwrap();
        let mut len = [0u8; 2];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        let tcp = Message::from_vec(&buf).unwrap();
        (api, web, tcp)
    });
    let (api, web, tcp) = answers;
    assert_eq!(api.answers[0].to_string(), "kubernetes.default.svc.cluster.local. 30 IN A 10.96.0.1");
    assert_eq!(web.answers[0].to_string(), format!("web.default.svc.cluster.local. 30 IN A {web_ip}"));
    assert_eq!(tcp.answers[0].to_string(), "kube-dns.kube-system.svc.cluster.local. 30 IN A 10.96.0.10");

    // A pod's own resolv.conf and hosts, as kubelet writes them, in the pod's mount namespace;
    // its resolver finds Services by short and full names; the node's files stay as they were.
    lab.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: client}\nspec:\n  hostname: c0\n  subdomain: sub\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '3600']\n");
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/client", "--timeout=30s"]);
    assert_eq!(
        lab.kubectl(&["exec", "client", "--", "cat", "/etc/resolv.conf"]),
        "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
    );
    let pod_ip = lab.kubectl(&["get", "pod", "client", "-o", "jsonpath={.status.podIP}"]);
    let hosts = lab.kubectl(&["exec", "client", "--", "cat", "/etc/hosts"]);
    assert!(hosts.contains(&format!("{pod_ip}\tc0.sub.default.svc.cluster.local\tc0\n")), "{hosts}");
    for name in ["web", "web.default", "web.default.svc.cluster.local"] {
        let out = lab.kubectl(&["exec", "client", "--", "getent", "hosts", name]);
        assert!(
            out.starts_with(&format!("{web_ip} ")) && out.contains("web.default.svc.cluster.local"),
            "{name}: {out}"
        );
    }
    let dns_pod = lab.cluster_dns_pods("{.items[0].metadata.name}");
    let dns_resolv = lab.kubectl(&["exec", "-n", "kube-system", &dns_pod, "--", "cat", "/etc/resolv.conf"]);
    assert!(!dns_resolv.contains("10.96.0.10"), "dnsPolicy Default: the node's resolver: {dns_resolv}");
    drop(lab);
    assert!(host_files() == before, "the node's /etc/resolv.conf and /etc/hosts are unchanged");
}

/// The YAML of the in-pod test: two namespaces with a client pod and a `web` Service each;
/// headless Services with hostnames (`db`, two pods), without (`anon`), without ready
/// endpoints (`nobody`), with 60 hand-made endpoints (`big`); an ExternalName (`ext`).
fn pods_and_services() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
         spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: web, labels: {app: web}}\n\
         spec: {containers: [{name: c, image: podpath/echo, ports: [{containerPort: 8080}]}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: team}\n\
         spec: {ports: [{name: http, port: 80}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: db}\n\
         spec: {clusterIP: None, selector: {app: db}, ports: [{name: pg, port: 5432}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: anon}\n\
         spec: {clusterIP: None, selector: {app: anon}, ports: [{port: 80}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: nobody}\n\
         spec: {clusterIP: None, selector: {app: nobody}, ports: [{port: 80}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: ext}\nspec: {type: ExternalName, externalName: example.org}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: big}\nspec: {clusterIP: None, ports: [{name: http, port: 80}]}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {name: big-1, labels: {kubernetes.io/service-name: big}}\n\
         addressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n",
    );
    for i in 1..=60 {
        y += &format!("- {{addresses: [10.250.0.{i}], conditions: {{ready: true}}}}\n");
    }
    let sleeper = "containers: [{name: c, image: busybox, command: [sleep, '3600']}]";
    for (ns, name, extra) in [
        ("default", "client", ""),
        ("team", "client", ""),
        ("default", "db-0", "hostname: db-0, subdomain: db, "),
        ("default", "db-1", "hostname: db-1, subdomain: db, "),
        ("default", "anon-1", ""),
    ] {
        let app = name.split('-').next().unwrap();
        y += &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}}}}}\nspec: {{{extra}{sleeper}}}\n"
        );
    }
    y
}

/// Real tools inside pods (dig, nslookup and getent read the pod's own resolv.conf): every
/// record type, search paths from two namespaces, ndots, TCP after truncation, a Service
/// answered within 1 s of its creation and gone within 1 s of its deletion, a request traced
/// by name, and a flood with oversized and malformed packets from one pod that the others do
/// not notice.
#[test]
fn pods_resolve_every_record_type_with_real_tools() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    let lab = podpath_e2e::Lab::up("dnspods", &["--nodes", "1"]).unwrap();
    lab.wait_for_cluster_dns();
    lab.apply(&pods_and_services());
    for ns in ["default", "team"] {
        lab.kubectl(&["wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=60s"]);
    }
    let ip = |what: &str, name: &str, ns: &str| {
        let path = if what == "svc" { "{.spec.clusterIP}" } else { "{.status.podIP}" };
        lab.kubectl(&["get", what, name, "-n", ns, "-o", &format!("jsonpath={path}")])
    };
    let (web, team_web) = (ip("svc", "web", "default"), ip("svc", "web", "team"));
    let (db0, db1, anon) = (ip("pod", "db-0", "default"), ip("pod", "db-1", "default"), ip("pod", "anon-1", "default"));
    let sh = |ns: &str, cmd: &[&str]| {
        let mut v = vec!["exec", "-n", ns, "client", "--"];
        v.extend_from_slice(cmd);
        lab.kubectl(&v)
    };
    let dig = |args: &[&str]| {
        let mut v = vec!["dig", "+short"];
        v.extend_from_slice(args);
        let mut lines: Vec<String> = sh("default", &v).lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let status = |args: &[&str]| {
        let mut v = vec!["dig"];
        v.extend_from_slice(args);
        let out = sh("default", &v);
        let s = out.split("status: ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("?").to_string();
        (s, out)
    };

    // A, SRV and PTR of a ClusterIP Service.
    assert_eq!(dig(&["web.default.svc.cluster.local"]), [web.as_str()]);
    assert_eq!(dig(&["SRV", "_http._tcp.web.default.svc.cluster.local"]), ["0 100 80 web.default.svc.cluster.local."]);
    assert_eq!(dig(&["-x", &web]), ["web.default.svc.cluster.local."]);
    // Headless with hostnames: every ready endpoint, each by its own name, SRV per endpoint.
    let mut both = vec![db0.clone(), db1.clone()];
    both.sort();
    assert_eq!(dig(&["db.default.svc.cluster.local"]), both);
    assert_eq!(dig(&["db-0.db.default.svc.cluster.local"]), [db0.as_str()]);
    assert_eq!(
        dig(&["SRV", "_pg._tcp.db.default.svc.cluster.local"]),
        ["0 50 5432 db-0.db.default.svc.cluster.local.", "0 50 5432 db-1.db.default.svc.cluster.local."]
    );
    assert_eq!(dig(&["-x", &db1]), ["db-1.db.default.svc.cluster.local."]);
    // Headless without hostnames: the dashed address names the endpoint.
    assert_eq!(dig(&["anon.default.svc.cluster.local"]), [anon.as_str()]);
    assert_eq!(dig(&[&format!("{}.anon.default.svc.cluster.local", anon.replace('.', "-"))]), [anon.as_str()]);
    // No ready endpoint: NXDOMAIN; a name that exists without that type: NODATA (NOERROR).
    assert_eq!(status(&["nobody.default.svc.cluster.local"]).0, "NXDOMAIN");
    let (code, out) = status(&["AAAA", "web.default.svc.cluster.local"]);
    assert!(code == "NOERROR" && out.contains("ANSWER: 0") && out.contains("IN\tSOA"), "{out}");
    // ExternalName (its target looked up upstream too, which the lab cannot reach: the CNAME
    // alone, after forward's 5 s), pod records, a name outside the cluster: forwarded to the
    // node's resolver (`forward . /etc/resolv.conf`), unreachable from the lab: SERVFAIL.
    assert_eq!(dig(&["+time=9", "+tries=1", "ext.default.svc.cluster.local"]), ["example.org."]);
    assert_eq!(dig(&[&format!("{}.default.pod.cluster.local", db0.replace('.', "-"))]), [db0.as_str()]);
    assert_eq!(status(&["+time=9", "+tries=1", "example.com"]).0, "SERVFAIL");

    // Search paths: `web` is each namespace's own, `web.default` crosses over.
    for (ns, name, want) in [("default", "web", &web), ("team", "web", &team_web), ("team", "web.default", &web)] {
        let out = sh(ns, &["getent", "hosts", name]);
        assert!(out.starts_with(&format!("{want} ")), "getent hosts {name} in {ns}: {out}");
    }
    let ns_out = sh("team", &["nslookup", "web"]);
    assert!(ns_out.contains("Name:\tweb.team.svc.cluster.local\nAddress: ") && ns_out.contains(&team_web), "{ns_out}");
    // ndots:5: `web.default` (one dot) goes through the search list first, the first try
    // in the pod's own namespace; a name ending in a dot is asked as it is, once.
    let tries = |ns: &str, name: &str| -> Vec<String> {
        sh(ns, &["dig", "+search", "+showsearch", "+noall", "+question", "+comments", name])
            .lines()
            .filter_map(|l| {
                l.strip_prefix(";; ->>HEADER<<- opcode: QUERY, status: ")
                    .map(|s| s.split(',').next().unwrap().to_string())
                    .or_else(|| {
                        l.strip_prefix(';')
                            .filter(|q| q.contains("\tIN\t") || q.contains(" IN\t"))
                            .map(|q| q.split_whitespace().next().unwrap().to_string())
                    })
            })
            .collect()
    };
    assert_eq!(
        tries("team", "web.default"),
        ["NXDOMAIN", "web.default.team.svc.cluster.local.", "NOERROR", "web.default.svc.cluster.local."]
    );
    assert_eq!(tries("team", "web.default.svc.cluster.local."), ["NOERROR", "web.default.svc.cluster.local."]);

    // 60 addresses do not fit 512 bytes: truncated over UDP, then TCP through the VIP's 53/TCP.
    let big = sh("default", &["dig", "+noedns", "big.default.svc.cluster.local"]);
    assert!(big.contains(";; Truncated, retrying in TCP mode."), "{big}");
    assert!(big.contains("ANSWER: 60,") && big.contains("(TCP)"), "{big}");
    let glibc = sh("default", &["getent", "ahostsv4", "big.default.svc.cluster.local"]);
    let distinct: std::collections::BTreeSet<&str> =
        glibc.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(distinct.len(), 60, "glibc's resolver falls back to TCP too: {glibc}");

    // Created → answered within 1 s, deleted → gone within 1 s (asked from the node, every 20 ms).
    let from_node = |name: &'static str, want: ResponseCode| {
        lab.in_netns("node-1", move || {
            let t = std::time::Instant::now();
            loop {
                let m = ask("10.96.0.10:53".parse().unwrap(), name, RecordType::A);
                if m.metadata.response_code == want {
                    return t.elapsed();
                }
                assert!(t.elapsed() < Duration::from_secs(1), "{name}: still {:?} after 1 s", m.metadata.response_code);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    lab.kubectl(&["create", "service", "clusterip", "fresh", "--tcp=80"]);
    from_node("fresh.default.svc.cluster.local.", ResponseCode::NoError);
    lab.kubectl(&["delete", "service", "fresh"]);
    from_node("fresh.default.svc.cluster.local.", ResponseCode::NXDomain);

    // `podpath trace` by name, from the team pod: the lookup, then the connection.
    let (ok, out, err) = lab.run_apart("trace", &["--from", "pod/team/client", "http://web.default/", "-o", "json"]);
    assert!(ok, "{out}{err}");
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    let q = &t["lookup"]["queries"];
    assert_eq!(
        (q[0]["name"].as_str(), q[0]["rcode"].as_str()),
        (Some("web.default.team.svc.cluster.local."), Some("NXDOMAIN"))
    );
    assert_eq!(
        (q[1]["name"].as_str(), q[1]["rcode"].as_str()),
        (Some("web.default.svc.cluster.local."), Some("NOERROR"))
    );
    assert!(q[1]["answered_by"].as_str().unwrap().contains("pod kube-system/coredns-"), "{out}");
    assert_eq!(t["lookup"]["owner"], "ClusterIP of Service default/web");
    assert_eq!(t["dst"], format!("{web}:80"));
    assert_eq!(t["outcome"]["status"], 200);
    assert_eq!(t["pod"], "default/web");
    let (ok, out) = lab.run("trace", &["--from", "pod/team/client", "http://nope/"]);
    assert!(!ok && out.contains("stopped: the lookup: nope did not resolve"), "{out}");

    // One pod floods for 3 s (at most 200,000 queries), with oversized and malformed datagrams
    // and an oversized TCP length; the other pod's lookups keep being answered meanwhile, and
    // no DNS pod restarts.
    let flood = r#"
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
q = bytes.fromhex('abcd01000001000000000000') + b''.join(bytes([len(l)]) + l.encode() for l in 'web.default.svc.cluster.local'.split('.')) + b'\x00\x00\x01\x00\x01'
junk = [b'', b'\x00', b'\xff' * 11, q[:20], b'\x12' * 4000, q[:12] + b'\x3f' + b'a' * 63 * 40]
t = time.time(); sent = 0
while sent < 200000 and time.time() - t < 3:
    try:
        s.sendto(junk[sent % len(junk)] if sent % 50 == 0 else q, ('10.96.0.10', 53)); sent += 1
    except BlockingIOError:
        time.sleep(0.001)
c = socket.create_connection(('10.96.0.10', 53), timeout=2)
c.sendall(b'\xff\xff' + b'\x00' * 100)
c.close()
print(sent)
"#;
    let flooder = std::thread::scope(|s| {
        let f = s.spawn(|| sh("default", &["python3", "-c", flood]));
        let mut answered = 0;
        for _ in 0..10 {
            if sh("team", &["getent", "hosts", "web"]).starts_with(&format!("{team_web} ")) {
                answered += 1;
            }
        }
        assert_eq!(answered, 10, "lookups from another pod during the flood");
        f.join().unwrap()
    });
    let sent: u32 = flooder.trim().parse().unwrap_or_else(|_| panic!("the flooder: {flooder}"));
    assert!(sent > 10_000, "a flood it was: {sent} datagrams");
    assert_eq!(dig(&["web.default.svc.cluster.local"]), [web.as_str()]);
    let restarts = lab.cluster_dns_pods("{.items[*].status.containerStatuses[0].restartCount}");
    assert_eq!(restarts, "0 0", "no DNS pod restarted");
}

/// A pod made as soon as `podpath up` returns resolves its first name at once, in every one
/// of 20 fresh labs: `up` waits until the cluster DNS answers on every node (before, the
/// kube-dns Service had no ready endpoint yet, its REJECT failed glibc's first lookup).
#[test]
fn the_first_lookup_of_a_new_pod_in_a_fresh_lab_answers() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    for run in 0..20 {
        let lab = podpath_e2e::Lab::up("first", &["--nodes", "2"]).expect("podpath up");
        lab.kubectl(&["create", "deployment", "web", "--image=podpath/echo"]);
        lab.kubectl(&["expose", "deployment", "web", "--port=80", "--target-port=8080"]);
        lab.kubectl(&["run", "c", "--image=busybox", "--", "sleep", "3600"]);
        lab.kubectl(&["wait", "--for=condition=Ready", "pod/c", "--timeout=60s"]);
        let t = std::time::Instant::now();
        let out = lab.kubectl(&["exec", "c", "--", "getent", "hosts", "web.default.svc.cluster.local"]);
        let took = t.elapsed();
        assert!(out.contains("web.default.svc.cluster.local"), "run {run}: {out}");
        assert!(took < Duration::from_secs(1), "run {run}: the first lookup took {took:?}");
    }
}
