//! The Rust `kube` crate (client + runtime watcher) against a real apiserver-lite process.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, Config};
use podpath_e2e::ApiServer;
use serde_json::json;

async fn client(srv: &ApiServer) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&srv.kubeconfig).unwrap();
    let cfg = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    Client::try_from(cfg).unwrap()
}

fn svc(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "kube-rs"}},
        "spec": {"type": "NodePort", "selector": {"app": "kube-rs"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn kube_rs_create_list_watch_delete() {
    let srv = ApiServer::start(&[]).unwrap();
    let client = client(&srv).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");

    // The runtime watcher: list, then watch with bookmarks from the list's resourceVersion.
    let mut events = watcher(services.clone(), watcher::Config::default().labels("app=kube-rs")).boxed();
    let initial_done = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(watcher::Event::InitDone) = events.try_next().await.unwrap() {
                break;
            }
        }
    });
    initial_done.await.expect("initial list completes");

    let created = services.create(&PostParams::default(), &svc("kube-svc")).await.unwrap();
    let np = created.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.unwrap();
    assert!((30000..=32767).contains(&np));
    let err = services.create(&PostParams::default(), &svc("kube-svc")).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409), "{err:?}");

    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(watcher::Event::Apply(s)) = events.try_next().await.unwrap() {
                return s;
            }
        }
    })
    .await
    .expect("the watcher sees the new Service");
    assert_eq!(got.metadata.name.as_deref(), Some("kube-svc"));

    assert!(services.get_opt("missing").await.unwrap().is_none());
    let list = services.list(&ListParams::default().labels("app=kube-rs")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.resource_version.is_some());

    let mut bad = svc("bad");
    bad.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(80);
    match services.create(&PostParams::default(), &bad).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert!(s.message.contains("spec.ports[0].nodePort"), "{}", s.message);
        }
        e => panic!("expected a 422 Status, got {e:?}"),
    }

    // Server-side apply (creates), merge and strategic patches.
    let applied =
        services.patch("applied", &PatchParams::apply("probe").force(), &Patch::Apply(svc("applied"))).await.unwrap();
    assert_eq!(applied.metadata.name.as_deref(), Some("applied"));
    let merged = services
        .patch("kube-svc", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})))
        .await
        .unwrap();
    assert_eq!(merged.metadata.labels.unwrap()["x"], "1");
    let strategic = services
        .patch(
            "kube-svc",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.spec.unwrap().ports.unwrap()[0].node_port, Some(np));

    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    assert!(pods.list(&ListParams::default()).await.unwrap().items.is_empty());
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(nodes.list(&ListParams::default()).await.unwrap().items.is_empty());

    services.delete("kube-svc", &DeleteParams::default()).await.unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(watcher::Event::Delete(s)) = events.try_next().await.unwrap() {
                return s;
            }
        }
    })
    .await
    .expect("the watcher sees the deletion");
    assert_eq!(deleted.metadata.name.as_deref(), Some("kube-svc"));

    // Discovery (legacy) finds the served kinds.
    let discovery = kube::discovery::Discovery::new(client).run().await.unwrap();
    let kinds: Vec<String> = discovery.groups().flat_map(|g| g.recommended_resources()).map(|(r, _)| r.kind).collect();
    for k in ["Service", "Pod", "Node", "Namespace", "Endpoints", "EndpointSlice"] {
        assert!(kinds.iter().any(|x| x == k), "{k} in {kinds:?}");
    }
}

/// A dual-stack API server (`--service-cluster-ip-range` with a CIDR of each family): kube-rs
/// creates a RequireDualStack Service IPv6-first and reads both `clusterIPs`, downgrades it by
/// merge patch, and gets kube-apiserver's words for a single-stack policy with two families.
#[tokio::test]
async fn kube_rs_reads_both_cluster_ips_of_a_dual_stack_service() {
    let srv = ApiServer::start(&["--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112"]).unwrap();
    let services: Api<Service> = Api::namespaced(client(&srv).await, "default");
    let dual: Service = serde_json::from_value(json!({
        "metadata": {"name": "rs-dual"},
        "spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"],
                 "selector": {"app": "rs"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .unwrap();
    let created = services.create(&PostParams::default(), &dual).await.unwrap();
    let spec = created.spec.unwrap();
    let ips: Vec<std::net::IpAddr> = spec.cluster_ips.clone().unwrap().iter().map(|i| i.parse().unwrap()).collect();
    assert!(ips.len() == 2 && ips[0].is_ipv6() && ips[1].is_ipv4(), "{ips:?}");
    assert_eq!(spec.cluster_ip.as_deref(), spec.cluster_ips.as_ref().map(|c| c[0].as_str()));
    assert_eq!(spec.ip_families.as_deref(), Some(&["IPv6".to_string(), "IPv4".to_string()][..]));
    let got = services.get("rs-dual").await.unwrap().spec.unwrap();
    assert_eq!(got.cluster_ips, spec.cluster_ips);

    let down = services
        .patch("rs-dual", &PatchParams::default(), &Patch::Merge(json!({"spec": {"ipFamilyPolicy": "SingleStack"}})))
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(down.cluster_ips.as_deref(), spec.cluster_ips.as_ref().map(|c| &c[..1]));
    assert_eq!(down.ip_families.as_deref(), Some(&["IPv6".to_string()][..]));

    let bad: Service = serde_json::from_value(json!({
        "metadata": {"name": "rs-bad"},
        "spec": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"], "ports": [{"port": 80}]}
    }))
    .unwrap();
    match services.create(&PostParams::default(), &bad).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert_eq!(
                s.message,
                "Service \"rs-bad\" is invalid: spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"
            );
        }
        e => panic!("expected a 422 Status, got {e:?}"),
    }
}
