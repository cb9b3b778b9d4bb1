//! What routing one request costs on a Gateway with many HTTPRoutes: 1,000 routes on one
//! listener, each with its own path prefix and a header match, the request matching the last
//! one made (the worst case of the linear walk) and matching none. Pure (no sockets): the
//! router as the proxy calls it. `cargo bench -p lb-sim --bench gateway`.

use std::time::Instant;

use lb_sim::gateway::plan::{self, Inputs};
use lb_sim::gateway::route::{self, Request};
use lb_sim::gateway::types::Obj;
use serde_json::json;

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p lb-sim --bench gateway");

fn main() {
    let routes = 1000;
    let mut inputs = Inputs {
        classes: vec![Obj::from_json(
            &json!({"metadata": {"name": "podpath"}, "spec": {"controllerName": "podpath.dev/gateway"}}),
        )
        .unwrap()],
        gateways: vec![Obj::from_json(&json!({"metadata": {"name": "gw", "namespace": "default"},
            "spec": {"gatewayClassName": "podpath", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}))
        .unwrap()],
        services: vec![serde_json::from_value(
            json!({"metadata": {"name": "podpath-gateway-gw", "namespace": "default"},
            "spec": {"ports": [{"port": 80}]}, "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}}),
        )
        .unwrap()],
        ..Default::default()
    };
    for i in 0..routes {
        inputs.http_routes.push(
            Obj::from_json(&json!({"metadata": {"name": format!("r{i:04}"), "namespace": "default",
                "creationTimestamp": format!("2026-11-27T10:{:02}:{:02}Z", i / 60 % 60, i % 60)},
                "spec": {"parentRefs": [{"name": "gw"}], "rules": [
                    {"matches": [{"path": {"type": "PathPrefix", "value": format!("/app{i}")}, "headers": [{"name": "x-team", "value": format!("t{i}")}]}],
                     "backendRefs": [{"name": "web", "port": 80}]}]}}))
            .unwrap(),
        );
    }
    let t = Instant::now();
    let p = plan::plan(&inputs);
    let plan_ms = t.elapsed().as_secs_f64() * 1000.0;
    let site = &p.sites[0];
    assert_eq!(site.listeners[0].rules.len(), routes);
    let last = format!("t{}", routes - 1);
    let headers = vec![("x-team".to_string(), last)];
    let path = format!("/app{}/x", routes - 1);
    let hit = Request { host: "web.example", method: "GET", path: &path, query: "", headers: &headers };
    let none = Vec::new();
    let miss = Request { host: "web.example", method: "GET", path: "/nothing", query: "", headers: &none };
    let n = 2000;
    let time = |r: &Request<'_>, expect: bool| {
        let t = Instant::now();
        for _ in 0..n {
            assert_eq!(route::route(site, r).is_some(), expect);
        }
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    };
    let (hit_us, miss_us) = (time(&hit, true), time(&miss, false));
    BENCH.record(
        "HTTPRoute matching, 1,000 routes on one listener, the last one matching, per request",
        (hit_us * 10.0).round() / 10.0,
        "µs",
        "",
    );
    BENCH.record("Gateway plan of 1,000 HTTPRoutes (statuses and sites)", plan_ms.round(), "ms", "");
    println!(
        "HTTPRoute matching with {routes} routes on one listener: {hit_us:.1} µs per request matching the last route, {miss_us:.1} µs per request matching none; the plan of all of them {plan_ms:.0} ms"
    );
}
