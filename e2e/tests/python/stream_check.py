"""The official Python `kubernetes` client's streaming calls against a podpath lab: `stream()`
exec (output, stdin, exit code), `read_namespaced_pod_log` and `portforward`.

Usage: stream_check.py KUBECONFIG. The lab runs pod `web` (podpath/echo on 8080) and `ticker`
(prints `tick N`). Prints one line per step; exits non-zero on the first failure.
"""
import sys

from kubernetes import client, config
from kubernetes.stream import portforward, stream


def step(msg):
    print(msg, flush=True)


def main(kubeconfig):
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()

    out = stream(v1.connect_get_namespaced_pod_exec, "web", "default",
                 command=["sh", "-c", "echo py-$((1+1))"], stderr=True, stdin=False, stdout=True, tty=False)
    assert out.strip() == "py-2", repr(out)
    step("exec: output")

    resp = stream(v1.connect_get_namespaced_pod_exec, "web", "default",
                  command=["sh", "-c", "read l; echo got-$l; echo oops >&2; exit 3"],
                  stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
    resp.write_stdin("abc\n")
    out, err = "", ""
    while resp.is_open():
        resp.update(timeout=1)
        if resp.peek_stdout():
            out += resp.read_stdout()
        if resp.peek_stderr():
            err += resp.read_stderr()
    # Each peek may read further frames, up to the close: a stdout frame read by the stderr
    # peek's update together with the close would otherwise be left in the client's buffer
    # (the server sends stdout and stderr as they come, in either order).
    out += resp.read_stdout()
    err += resp.read_stderr()
    assert out.strip() == "got-abc", repr(out)
    assert err.strip() == "oops", repr(err)
    assert resp.returncode == 3, resp.returncode
    step("exec: stdin, stderr and exit code 3")

    log = v1.read_namespaced_pod_log("ticker", "default", tail_lines=2)
    lines = log.splitlines()
    assert len(lines) == 2 and all(l.startswith("tick ") for l in lines), repr(log)
    step(f"log: {lines}")

    pf = portforward(v1.connect_get_namespaced_pod_portforward, "web", "default", ports="8080")
    sock = pf.socket(8080)
    sock.setblocking(True)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    sock.close()
    assert b"pod: default/web" in data, data
    assert pf.error(8080) is None, pf.error(8080)
    pf.close()
    step("port-forward: an HTTP request to 8080")
    print("python streaming: ok")


if __name__ == "__main__":
    main(sys.argv[1])
