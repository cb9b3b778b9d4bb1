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
    let dns_pod = lab.kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "k8s-app=kube-dns",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let dns_resolv = lab.kubectl(&["exec", "-n", "kube-system", &dns_pod, "--", "cat", "/etc/resolv.conf"]);
    assert!(!dns_resolv.contains("10.96.0.10"), "dnsPolicy Default: the node's resolver: {dns_resolv}");
    drop(lab);
    assert!(host_files() == before, "the node's /etc/resolv.conf and /etc/hosts are unchanged");
}
