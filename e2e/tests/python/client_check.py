"""Drives apiserver-lite with the official Python `kubernetes` client.

Usage: client_check.py KUBECONFIG. Prints one line per step; exits non-zero on the first failure.
"""
import json
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

    # RBAC: a ServiceAccount bound to a Role that reads pods, its token from the TokenRequest
    # API; a client with that token lists pods and gets kube-apiserver's 403 for Services.
    rbac = client.RbacAuthorizationV1Api()
    v1.create_namespaced_service_account("default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="py-reader")))
    rbac.create_namespaced_role("default", client.V1Role(
        metadata=client.V1ObjectMeta(name="py-pod-reader"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])]))
    rbac.create_namespaced_role_binding("default", client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="py-read-pods"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="py-pod-reader"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="py-reader", namespace="default")]))
    tr = v1.create_namespaced_service_account_token("py-reader", "default", client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)))
    sa_cfg = client.Configuration.get_default_copy()
    sa_cfg.api_key = {"authorization": "Bearer " + tr.status.token}
    # The kubeconfig loader's hook would put the kubeconfig's token back before each request.
    sa_cfg.refresh_api_key_hook = None
    sa = client.CoreV1Api(client.ApiClient(sa_cfg))
    sa.list_namespaced_pod("default")
    try:
        sa.list_namespaced_service("default")
        raise AssertionError("a ServiceAccount that reads pods listed Services")
    except ApiException as e:
        assert e.status == 403, e
        message = json.loads(e.body)["message"]
        assert message == ('services is forbidden: User "system:serviceaccount:default:py-reader" cannot list '
                           'resource "services" in API group "" in the namespace "default"'), message
    review = client.AuthorizationV1Api(client.ApiClient(sa_cfg)).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace="default", verb="list", resource="pods"))))
    assert review.status.allowed, review.status
    step("rbac: a ServiceAccount token reads pods, is refused Services (403), and its access review agrees")

    # autoscaling/v2, read back through autoscaling/v1.
    client.AutoscalingV2Api().create_namespaced_horizontal_pod_autoscaler("default", client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name="py-hpa"),
        spec=client.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=client.V2CrossVersionObjectReference(api_version="apps/v1", kind="Deployment", name="py"),
            min_replicas=1, max_replicas=4, metrics=[client.V2MetricSpec(type="Resource", resource=client.V2ResourceMetricSource(
                name="cpu", target=client.V2MetricTarget(type="Utilization", average_utilization=60)))])))
    old = client.AutoscalingV1Api().read_namespaced_horizontal_pod_autoscaler("py-hpa", "default")
    assert old.spec.target_cpu_utilization_percentage == 60 and old.spec.max_replicas == 4, old.spec
    step("autoscaling/v2 HorizontalPodAutoscaler created, read as autoscaling/v1")

    t.join(timeout=15)
    assert ("ADDED", "py-svc") in seen and ("DELETED", "py-svc") in seen, seen
    assert ("MODIFIED", "py-svc") in seen, seen
    step(f"watch saw {len(seen)} events")
    print("python client: ok")


if __name__ == "__main__":
    main(sys.argv[1])
