//! The Gateway API on the lab's gateway, with the real kubectl and curl from the client: a
//! Gateway gets an address from the pool, an HTTPRoute splits traffic 90/10 between two
//! Deployments (measured over 2,000 requests), a header match sends to one, a redirect answers
//! at the gateway, each other match kind (exact, regular expression, query parameter, method)
//! and filter (response headers, URL rewrite, a mirror whose pod logs the copy) on a second
//! route, a route to another namespace's Service is refused until a ReferenceGrant allows it;
//! statuses read back as the spec words them. Root only.

use std::time::Duration;

use podpath_e2e::{wait_for, Lab};
use testkit::netns::root_or_explain;

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: web
spec:
  gatewayClassName: podpath
  listeners:
  - name: http
    protocol: HTTP
    port: 80
    allowedRoutes:
      namespaces:
        from: All
  - name: https
    protocol: HTTPS
    port: 443
    hostname: secure.example
    tls:
      certificateRefs:
      - name: secure-example
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: web
spec:
  parentRefs:
  - name: web
  rules:
  - matches:
    - headers:
      - name: x-canary
        value: always
    backendRefs:
    - name: canary
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /old
    filters:
    - type: RequestRedirect
      requestRedirect:
        path:
          type: ReplacePrefixMatch
          replacePrefixMatch: /new
        statusCode: 301
  - matches:
    - path:
        type: PathPrefix
        value: /
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        add:
        - name: x-lab
          value: gateway
    backendRefs:
    - name: web
      port: 80
      weight: 90
    - name: canary
      port: 80
      weight: 10
";

/// A Deployment of podpath/echo with `args` on `port`, and its Service (`service_port`, with
/// more fields).
fn echo_app(name: &str, args: &str, port: u16, service_port: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - {{name: {name}, image: podpath/echo, args: {args}, ports: [{{containerPort: {port}}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: {name}}}
spec:
  selector: {{app: {name}}}
  ports: [{{{service_port}, targetPort: {port}}}]
"
    )
}

const GRPC_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: health}
spec:
  parentRefs: [{name: web}]
  hostnames: [grpc.example]
  rules:
  - matches:
    - method: {service: grpc.health.v1.Health, method: Check}
    backendRefs: [{name: grpc, port: 9000}]
";

/// Every match kind and the other filters, on their own hostname; the mirror's `shadow` logs
/// what it gets.
const MATCHES: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: matches}
spec:
  parentRefs: [{name: web}]
  hostnames: [match.example]
  rules:
  - matches: [{path: {type: Exact, value: /exact}}]
    filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-matched, value: exact}]}}
    backendRefs: [{name: web, port: 80}]
  - matches: [{path: {type: RegularExpression, value: '/items/[0-9]+'}}]
    filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-matched, value: regex}]}}
    backendRefs: [{name: web, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /search}, queryParams: [{name: beta, value: '1'}]}]
    filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-matched, value: query}]}}
    backendRefs: [{name: canary, port: 80}]
  - matches: [{method: DELETE}]
    filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-matched, value: method}]}}
    backendRefs: [{name: canary, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /api}}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: backend.internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 80}}
    backendRefs: [{name: web, port: 80}]
  - filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-matched, value: default}]}}
    backendRefs: [{name: web, port: 80}]
";

fn condition(lab: &Lab, what: &str, path: &str) -> String {
    lab.kubectl(&["get", what, "-o", &format!("jsonpath={path}")])
}

#[test]
fn a_gateway_splits_matches_and_redirects() {
    if !root_or_explain() {
        return;
    }
    let before = testkit::netns::host_state();
    let lab = Lab::up("gwapi", &["--nodes", "2"]).unwrap();
    // The lab's own Gateway API CRDs and GatewayClass (no internet here).
    let (ok, out) = lab.run("gateway-api", &["install"]);
    assert!(ok && out.contains("gatewayclass.gateway.networking.k8s.io/podpath created"), "{out}");
    for (name, replicas) in [("web", "2"), ("canary", "1")] {
        lab.kubectl(&[
            "create",
            "deployment",
            name,
            "--image=podpath/echo",
            &format!("--replicas={replicas}"),
            "--port=8080",
        ]);
        lab.kubectl(&["expose", "deployment", name, "--port=80", "--target-port=8080"]);
    }
    // A gRPC server (podpath/echo's health service on 9000).
    lab.apply(&echo_app(
        "grpc",
        "[--grpc-port, '9000']",
        9000,
        "name: grpc, port: 9000, appProtocol: kubernetes.io/h2c",
    ));
    lab.apply(GRPC_ROUTE);
    lab.kubectl(&["rollout", "status", "deployment/web", "deployment/canary", "deployment/grpc", "--timeout=60s"]);
    // The HTTPS listener's certificate, in a kubernetes.io/tls Secret.
    let cert = rcgen::generate_simple_self_signed(vec!["secure.example".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.signing_key.serialize_pem()).unwrap();
    lab.kubectl(&[
        "create",
        "secret",
        "tls",
        "secure-example",
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    lab.apply(GATEWAY);
    lab.kubectl(&["wait", "--for=condition=Programmed", "gateway/web", "--timeout=30s"]);
    let vip = condition(&lab, "gateway/web", "{.status.addresses[0].value}");
    assert!(vip.starts_with("198.51.100."), "{vip}");
    // The Gateway's Service holds its address.
    let svc = lab.kubectl(&[
        "get",
        "svc",
        "-l",
        "gateway.networking.k8s.io/gateway-name=web",
        "-o",
        "jsonpath={.items[0].status.loadBalancer.ingress[0].ip}",
    ]);
    assert_eq!(svc, vip);
    assert_eq!(condition(&lab, "gatewayclass/podpath", "{.status.conditions[?(@.type==\"Accepted\")].status}"), "True");
    wait_for(Duration::from_secs(10), "the route's status", || {
        let s = condition(&lab, "httproute/web", "{.status.parents[0].conditions[*].reason}");
        if s == "Accepted ResolvedRefs" {
            Ok(())
        } else {
            Err(s)
        }
    });
    // The HTTPRoute and the GRPCRoute.
    assert_eq!(condition(&lab, "gateway/web", "{.status.listeners[0].attachedRoutes}"), "2");
    let table = lab.kubectl(&["get", "gateway", "web"]);
    assert!(table.contains("podpath") && table.contains(&vip) && table.contains("True"), "{table}");

    // A request through the Gateway lands on a pod, with the rule's header added.
    let url = format!("http://{vip}/");
    let (code, out) = lab.curl(&[&url]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pod: default/web-") || out.contains("pod: default/canary-"), "{out}");
    assert!(out.to_ascii_lowercase().contains("x-lab: gateway"), "{out}");

    // 90/10 over 2,000 requests (one curl, URL globbing: one connection, a pick per request).
    let (code, out) = lab.curl(&[&format!("http://{vip}/[1-2000]")]);
    assert_eq!(code, 0, "{}", &out[..out.len().min(500)]);
    let web = out.matches("pod: default/web-").count();
    let canary = out.matches("pod: default/canary-").count();
    assert_eq!(web + canary, 2000, "{web} + {canary}");
    let share = canary as f64 / 2000.0;
    assert!((0.07..=0.13).contains(&share), "canary share {share:.3} (web {web}, canary {canary})");

    // HTTPS, terminated at the gateway with the Secret's certificate (checked by curl).
    let (code, out) = lab.curl(&[
        "--cacert",
        crt.to_str().unwrap(),
        "--resolve",
        &format!("secure.example:443:{vip}"),
        "https://secure.example/",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.to_ascii_lowercase().contains("x-forwarded-proto: https"), "{out}");
    assert_eq!(
        condition(&lab, "gateway/web", "{.status.listeners[1].conditions[?(@.type==\"ResolvedRefs\")].status}"),
        "True"
    );

    // A GRPCRoute to the gRPC server: a real gRPC call (HTTP/2 with prior knowledge, a
    // length-prefixed empty HealthCheckRequest), answered SERVING (08 01) with grpc-status 0.
    wait_for(Duration::from_secs(10), "the GRPCRoute's status", || {
        let s = condition(&lab, "grpcroute/health", "{.status.parents[0].conditions[*].reason}");
        if s == "Accepted ResolvedRefs" {
            Ok(())
        } else {
            Err(s)
        }
    });
    let frame = dir.path().join("check.bin");
    std::fs::write(&frame, [0u8, 0, 0, 0, 0]).unwrap();
    let (code, out) = lab.curl(&[
        "--http2-prior-knowledge",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-w",
        "body %{size_download}",
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        "-H",
        "Host: grpc.example",
        "--data-binary",
        &format!("@{}", frame.display()),
        &format!("http://{vip}/grpc.health.v1.Health/Check"),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("x-pod: default/grpc-") && out.contains("grpc-status: 0") && out.contains("body 7"), "{out}");

    // `podpath explain gateway` and `podpath trace` through the Gateway.
    let (ok, out) = lab.run("explain", &["gateway", "web"]);
    assert!(ok, "{out}");
    for want in [
        "Gateway default/web (class podpath)",
        "Programmed True (Programmed",
        "http: HTTP port 80, 2 route(s) attached",
        "HTTPRoute default/web rule 2: PathPrefix / filters RequestHeaderModifier → default/web:80 (weight 90: 10.244.",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let (ok, out) = lab.run("trace", &[&format!("http://{vip}/trace-me")]);
    assert!(ok, "{out}");
    for want in [
        "Gateway default/web listener http took",
        "/trace-me",
        "matched HTTPRoute default/web rule 2: PathPrefix /",
        "filters applied: RequestHeaderModifier",
        "(weight ",
    ] {
        assert!(out.contains(want), "missing {want:?} in the trace:\n{out}");
    }

    // A header match.
    let (_, out) = lab.curl(&["-H", "x-canary: always", &format!("http://{vip}/[1-20]")]);
    assert_eq!(out.matches("pod: default/canary-").count(), 20, "{out}");

    // A redirect, answered by the gateway.
    let (_, out) =
        lab.curl(&["-o", "/dev/null", "-w", "%{http_code} %{redirect_url}", &format!("http://{vip}/old/page?x=1")]);
    assert_eq!(out.trim(), format!("301 http://{vip}/new/page?x=1"));

    // Every other match kind and filter, on the second route's hostname.
    lab.apply(&echo_app("shadow", "[--access-log]", 8080, "port: 80"));
    lab.apply(MATCHES);
    lab.kubectl(&["rollout", "status", "deployment/shadow", "--timeout=60s"]);
    wait_for(Duration::from_secs(10), "the second route's status", || {
        let s = condition(&lab, "httproute/matches", "{.status.parents[0].conditions[*].reason}");
        if s == "Accepted ResolvedRefs" {
            Ok(())
        } else {
            Err(s)
        }
    });
    let matched = |args: &[&str], path: &str| {
        let mut all = vec!["-s", "-D", "-", "-H", "Host: match.example"];
        all.extend_from_slice(args);
        let url = format!("http://{vip}{path}");
        all.push(&url);
        let (code, out) = lab.curl(&all);
        assert_eq!(code, 0, "{out}");
        let header = out.lines().find_map(|l| l.strip_prefix("x-matched: ")).unwrap_or("").trim().to_string();
        (header, out)
    };
    for (args, path, want, pod) in [
        (&[][..], "/exact", "exact", "web"),
        (&[], "/exact/more", "default", "web"),
        (&[], "/items/42", "regex", "web"),
        (&[], "/items/x42", "default", "web"),
        (&[], "/search?beta=1", "query", "canary"),
        (&[], "/search?beta=2", "default", "web"),
        (&["-X", "DELETE"], "/anything", "method", "canary"),
    ] {
        let (got, out) = matched(args, path);
        assert_eq!(
            got, want,
            "{args:?} {path}:
{out}"
        );
        assert!(
            out.contains(&format!("pod: default/{pod}-")),
            "{path}:
{out}"
        );
    }
    // URLRewrite: the pod sees the new host and path; RequestMirror: shadow logs the same.
    let (_, out) = matched(&[], "/api/items?page=2");
    assert!(out.contains("GET /v2/items?page=2 HTTP/1.1"), "{out}");
    assert!(out.to_ascii_lowercase().contains("host: backend.internal"), "{out}");
    wait_for(Duration::from_secs(10), "the mirror's copy in shadow's log", || {
        let log = lab.kubectl(&["logs", "deployment/shadow"]);
        if log.contains("\"GET /v2/items?page=2 HTTP/1.1\" 200 host=backend.internal") {
            Ok(())
        } else {
            Err(log)
        }
    });
    let (ok, out) = lab.run("trace", &["--host", "match.example", &format!("http://{vip}/api/traced")]);
    assert!(ok, "{out}");
    assert!(out.contains("filters applied: URLRewrite, RequestMirror to default/shadow:80"), "{out}");

    // A route in another namespace to a Service of default: refused until a ReferenceGrant.
    lab.kubectl(&["create", "namespace", "shop"]);
    lab.apply("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shop, namespace: shop}\nspec:\n  parentRefs: [{name: web, namespace: default}]\n  hostnames: [shop.example]\n  rules:\n  - backendRefs: [{name: web, namespace: default, port: 80}]\n");
    wait_for(Duration::from_secs(10), "RefNotPermitted", || {
        let s = lab.kubectl(&[
            "get",
            "-n",
            "shop",
            "httproute/shop",
            "-o",
            "jsonpath={.status.parents[0].conditions[?(@.type==\"ResolvedRefs\")].reason}",
        ]);
        if s == "RefNotPermitted" {
            Ok(())
        } else {
            Err(s)
        }
    });
    let (_, out) = lab.curl(&["-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: shop.example", &url]);
    assert_eq!(out.trim(), "500", "requests to a backend that is not permitted get a 500");
    lab.apply("apiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {name: shop, namespace: default}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]\n  to: [{group: \"\", kind: Service}]\n");
    wait_for(Duration::from_secs(10), "the grant to take effect", || {
        let (_, out) = lab.curl(&["-H", "Host: shop.example", &url]);
        if out.contains("pod: default/web-") {
            Ok(())
        } else {
            Err(out)
        }
    });
    // The route moved to a Gateway that does not exist: this controller's status entry goes.
    lab.kubectl(&[
        "patch",
        "-n",
        "shop",
        "httproute/shop",
        "--type=merge",
        "-p",
        r#"{"spec": {"parentRefs": [{"name": "nowhere", "namespace": "default"}]}}"#,
    ]);
    wait_for(Duration::from_secs(10), "the stale parent status to go", || {
        let s =
            lab.kubectl(&["get", "-n", "shop", "httproute/shop", "-o", "jsonpath={.status.parents[*].controllerName}"]);
        if s.is_empty() {
            Ok(())
        } else {
            Err(s)
        }
    });
    drop(lab);
    assert_eq!(testkit::netns::host_state(), before, "the host namespace changed");
}
