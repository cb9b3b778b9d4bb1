"""Drives apiserver-lite with the official Python `kubernetes` client.

Usage: client_check.py KUBECONFIG. Prints one line per step; exits non-zero on the first failure.
"""
import sys
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def step(msg):
    print(msg, flush=True)


def main(kubeconfig):
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()

    info = client.VersionApi().get_code()
    assert info.minor == "32", info
    step(f"version {info.git_version}")

    # Watch in the background from "now" (no resourceVersion: ADDED for what exists first).
    seen = []
    w = watch.Watch()

    def watcher():
        for ev in w.stream(v1.list_namespaced_service, "default", timeout_seconds=10):
            seen.append((ev["type"], ev["object"].metadata.name))
            if ev["type"] == "DELETED" and ev["object"].metadata.name == "py-svc":
                w.stop()

    t = threading.Thread(target=watcher)
    t.start()

    body = client.V1Service(
        metadata=client.V1ObjectMeta(name="py-svc", labels={"app": "py"}),
        spec=client.V1ServiceSpec(
            type="LoadBalancer",
            selector={"app": "py"},
            ports=[client.V1ServicePort(name="http", port=80, target_port=8080)],
        ),
    )
    created = v1.create_namespaced_service("default", body)
    assert created.spec.cluster_ip.startswith("10."), created.spec
    assert 30000 <= created.spec.ports[0].node_port <= 32767
    assert created.status.load_balancer.ingress[0].ip.startswith("198.51.100.")
    step(f"created {created.metadata.name} {created.spec.cluster_ip}")

    try:
        v1.create_namespaced_service("default", body)
        raise AssertionError("duplicate create succeeded")
    except ApiException as e:
        assert e.status == 409, e
    step("duplicate create: 409")

    names = [s.metadata.name for s in v1.list_namespaced_service("default").items]
    assert "py-svc" in names and "kubernetes" in names, names
    assert len(v1.list_service_for_all_namespaces(label_selector="app=py").items) == 1
    step(f"list {sorted(names)}")

    patched = v1.patch_namespaced_service("py-svc", "default", {"metadata": {"labels": {"tier": "web"}}})
    assert patched.metadata.labels == {"app": "py", "tier": "web"}, patched.metadata.labels
    assert patched.spec.ports[0].node_port == created.spec.ports[0].node_port
    step("strategic patch")

    replaced = v1.replace_namespaced_service("py-svc", "default", patched)
    assert replaced.spec.cluster_ip == created.spec.cluster_ip
    step("replace")

    # Nodes and pods deserialize with the strict pydantic models.
    nodes = v1.list_node()
    step(f"nodes {len(nodes.items)}")
    pod = v1.create_namespaced_pod("default", client.V1Pod(
        metadata=client.V1ObjectMeta(name="py-pod", labels={"app": "py"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="podpath/echo",
                                                             ports=[client.V1ContainerPort(container_port=8080)])])))
    assert pod.status.phase == "Pending"
    assert v1.delete_namespaced_pod("py-pod", "default").metadata.name == "py-pod"
    step("pod create/delete")

    try:
        v1.read_namespaced_service("nope", "default")
        raise AssertionError("missing service found")
    except ApiException as e:
        assert e.status == 404, e
    step("read missing: 404")

    deleted = v1.delete_namespaced_service("py-svc", "default")
    assert deleted.metadata.name == "py-svc"
    step("delete")

    # A created Deployment comes back with a status the client can read (it broke on none).
    apps = client.AppsV1Api()
    dep = {"metadata": {"name": "py-dep"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "py"}},
                    "template": {"metadata": {"labels": {"app": "py"}},
                                 "spec": {"containers": [{"name": "c", "image": "podpath/echo"}]}}}}
    created = apps.create_namespaced_deployment("default", dep)
    assert created.status is not None, created
    apps.delete_namespaced_deployment("py-dep", "default")
    step("deployment: created with a status, deleted")

    # A Job's status as its controller writes it (no node runs its pod here: active, started).
    batch = client.BatchV1Api()
    job = {"metadata": {"name": "py-job"},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}}}
    batch.create_namespaced_job("default", job)
    st = None
    for _ in range(100):
        st = batch.read_namespaced_job_status("py-job", "default").status
        if st.active == 1 and st.start_time is not None:
            break
        time.sleep(0.1)
    assert st.active == 1 and st.start_time is not None and st.ready == 0, st
    batch.delete_namespaced_job("py-job", "default", propagation_policy="Background")
    step(f"job: status read (active {st.active}, started {st.start_time})")

    # A StatefulSet's status as its controller writes it (its first pod made, not yet ready).
    sts = {"metadata": {"name": "py-sts"},
           "spec": {"replicas": 2, "serviceName": "py-sts", "selector": {"matchLabels": {"app": "py-sts"}},
                    "template": {"metadata": {"labels": {"app": "py-sts"}},
                                 "spec": {"containers": [{"name": "c", "image": "podpath/echo"}]}}}}
    apps.create_namespaced_stateful_set("default", sts)
    ss = None
    for _ in range(100):
        ss = apps.read_namespaced_stateful_set_status("py-sts", "default").status
        if ss.replicas == 1 and ss.update_revision:
            break
        time.sleep(0.1)
    assert ss.replicas == 1 and ss.ready_replicas == 0 and ss.update_revision.startswith("py-sts-"), ss
    apps.delete_namespaced_stateful_set("py-sts", "default")
    step(f"statefulset: status read (replicas {ss.replicas}, revision {ss.update_revision})")

    # events.k8s.io/v1 through the client's typed EventsV1Api: created in that version, read
    # back in both. About an object no controller writes events for (the Deployment above gets
    # the controller's ScalingReplicaSet, a legacy event without eventTime, which this client's
    # model cannot read: a known limit of the Python client, against any server).
    ev1 = client.EventsV1Api()
    from datetime import datetime, timezone
    body = client.EventsV1Event(
        metadata=client.V1ObjectMeta(name="py-ev.1"),
        event_time=datetime.now(timezone.utc), reporting_controller="example.com/py",
        reporting_instance="py-1", action="Check", reason="Checked", type="Normal",
        note="checked by the python client",
        regarding=client.V1ObjectReference(kind="ConfigMap", name="py-ev", namespace="default"))
    made = ev1.create_namespaced_event("default", body)
    assert made.note == "checked by the python client", made
    got = ev1.list_namespaced_event("default", field_selector="regarding.name=py-ev")
    assert [e.metadata.name for e in got.items] == ["py-ev.1"], got
    core = v1.read_namespaced_event("py-ev.1", "default")
    assert core.message == "checked by the python client" and core.involved_object.name == "py-ev", core
    step("events.k8s.io/v1: created, listed by regarding.name, read as core/v1")

    # Paging: limit and _continue over 7 ConfigMaps, each seen once, in order.
    for i in range(7):
        v1.create_namespaced_config_map("default", client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=f"py-page-{i}", labels={"paged": "yes"}), data={"i": str(i)}))
    paged, token, pages = [], None, 0
    while True:
        page = v1.list_namespaced_config_map("default", label_selector="paged=yes", limit=3, _continue=token)
        paged += [c.metadata.name for c in page.items]
        pages += 1
        token = page.metadata._continue
        if not token:
            break
    assert paged == [f"py-page-{i}" for i in range(7)] and pages == 3, (paged, pages)
    for i in range(7):
        v1.delete_namespaced_config_map(f"py-page-{i}", "default")
    step(f"paged through {len(paged)} ConfigMaps in {pages} pages with limit and _continue")

    t.join(timeout=15)
    assert ("ADDED", "py-svc") in seen and ("DELETED", "py-svc") in seen, seen
    assert ("MODIFIED", "py-svc") in seen, seen
    step(f"watch saw {len(seen)} events")
    print("python client: ok")


if __name__ == "__main__":
    main(sys.argv[1])
