"""The official Python `kubernetes` client against a dual-stack apiserver-lite: a
RequireDualStack Service gets a ClusterIP of each family, a downgrade releases the second,
and a single-stack policy with two families is refused with kube-apiserver's words.

Usage: dualstack_check.py KUBECONFIG. Prints one line per step; exits non-zero on the first failure.
"""
import ipaddress
import json
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException


def main(kubeconfig):
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()
    body = client.V1Service(
        metadata=client.V1ObjectMeta(name="py-dual"),
        spec=client.V1ServiceSpec(
            ip_family_policy="RequireDualStack",
            ip_families=["IPv6", "IPv4"],
            selector={"app": "py"},
            ports=[client.V1ServicePort(port=80, target_port=8080)],
        ),
    )
    svc = v1.create_namespaced_service("default", body)
    ips = [ipaddress.ip_address(ip) for ip in svc.spec.cluster_ips]
    assert [ip.version for ip in ips] == [6, 4], svc.spec.cluster_ips
    assert svc.spec.cluster_ip == svc.spec.cluster_ips[0], svc.spec
    assert svc.spec.ip_families == ["IPv6", "IPv4"], svc.spec.ip_families
    print(f"clusterIPs {svc.spec.cluster_ips}", flush=True)

    got = v1.read_namespaced_service("py-dual", "default")
    assert got.spec.cluster_ips == svc.spec.cluster_ips, got.spec.cluster_ips

    down = v1.patch_namespaced_service("py-dual", "default", {"spec": {"ipFamilyPolicy": "SingleStack"}})
    assert down.spec.cluster_ips == svc.spec.cluster_ips[:1], down.spec.cluster_ips
    assert down.spec.ip_families == ["IPv6"], down.spec.ip_families
    print("downgraded to SingleStack", flush=True)

    bad = client.V1Service(
        metadata=client.V1ObjectMeta(name="py-bad"),
        spec=client.V1ServiceSpec(
            ip_family_policy="SingleStack",
            ip_families=["IPv4", "IPv6"],
            ports=[client.V1ServicePort(port=80)],
        ),
    )
    try:
        v1.create_namespaced_service("default", bad)
        raise AssertionError("a SingleStack Service with two families was created")
    except ApiException as e:
        assert e.status == 422, e.status
        message = json.loads(e.body)["message"]
        want = ('Service "py-bad" is invalid: spec.ipFamilyPolicy: Invalid value: "SingleStack": '
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified")
        assert message == want, message
    print("refused SingleStack with two families", flush=True)
    v1.delete_namespaced_service("py-dual", "default")
    print("python dual-stack: ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
