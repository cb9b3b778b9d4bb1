"""Drives apiserver-lite with kubernetes_asyncio (its watches send `watch=True`) and kr8s
(which reads a created Deployment's status).

Usage: async_check.py KUBECONFIG. Prints one line per step; exits non-zero on the first failure.
"""
import asyncio
import sys

import kr8s
from kr8s.objects import Deployment
from kubernetes_asyncio import client, config, watch


def step(msg):
    print(msg, flush=True)


async def with_asyncio(kubeconfig):
    await config.load_kube_config(config_file=kubeconfig)
    async with client.ApiClient() as api:
        v1 = client.CoreV1Api(api)
        body = {"metadata": {"name": "async-web"},
                "spec": {"selector": {"app": "async"}, "ports": [{"port": 80, "targetPort": 8080}]}}
        svc = await v1.create_namespaced_service("default", body)
        step(f"asyncio: created service async-web, clusterIP {svc.spec.cluster_ip}")
        seen = []
        w = watch.Watch()
        async for ev in w.stream(v1.list_namespaced_service, "default", timeout_seconds=5):
            seen.append((ev["type"], ev["object"].metadata.name))
            if ev["object"].metadata.name == "async-web":
                w.stop()
        assert ("ADDED", "async-web") in seen, seen
        step(f"asyncio: watch saw {seen}")
        apps = client.AppsV1Api(api)
        dep = {"metadata": {"name": "async-dep"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "async"}},
                        "template": {"metadata": {"labels": {"app": "async"}},
                                     "spec": {"containers": [{"name": "c", "image": "podpath/echo"}]}}}}
        d = await apps.create_namespaced_deployment("default", dep)
        assert d.status is not None, d
        step("asyncio: created deployment async-dep with a status")
        await apps.delete_namespaced_deployment("async-dep", "default")
        await v1.delete_namespaced_service("async-web", "default")


def with_kr8s(kubeconfig):
    api = kr8s.api(kubeconfig=kubeconfig)
    d = Deployment({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kr8s-dep", "namespace": "default"},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "kr8s"}},
                             "template": {"metadata": {"labels": {"app": "kr8s"}},
                                          "spec": {"containers": [{"name": "c", "image": "podpath/echo"}]}}}}, api=api)
    d.create()
    step(f"kr8s: created deployment kr8s-dep, replicas {d.replicas}")
    d.scale(3)
    d.refresh()
    assert d.spec.replicas == 3, d.spec
    step("kr8s: scaled to 3")
    names = [x.name for x in api.get("deployments", namespace="default")]
    assert "kr8s-dep" in names, names
    d.delete()
    step("kr8s: deleted")


def main(kubeconfig):
    asyncio.run(with_asyncio(kubeconfig))
    with_kr8s(kubeconfig)
    print("async clients: ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
