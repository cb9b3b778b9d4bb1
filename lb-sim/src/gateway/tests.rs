//! The Gateway API conformance suite's cases for the core and the extended features the lab
//! claims, re-expressed over the pure plan and router (the Go suite cannot run here). Each test
//! names the upstream test whose behaviour it checks.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};

use super::plan::{self, Inputs, Plan};
use super::route::{self, Request};
use super::types::*;

fn obj<S: for<'de> serde::Deserialize<'de> + Default>(v: Value) -> Obj<S> {
    Obj::from_json(&v).expect("decodes")
}

fn class() -> GatewayClass {
    obj(json!({"metadata": {"name": "podpath", "generation": 1}, "spec": {"controllerName": CONTROLLER}}))
}

fn gateway(name: &str, listeners: Value) -> Gateway {
    obj(json!({"metadata": {"name": name, "namespace": "infra", "generation": 2, "uid": "u1"},
               "spec": {"gatewayClassName": "podpath", "listeners": listeners}}))
}

fn http() -> Value {
    json!([{"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}])
}

fn route(ns: &str, name: &str, created: &str, spec: Value) -> HttpRoute {
    obj(
        json!({"metadata": {"name": name, "namespace": ns, "generation": 1, "creationTimestamp": created}, "spec": spec}),
    )
}

fn service(ns: &str, name: &str, port: i32) -> core::Service {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": port, "targetPort": 8080}]}}))
    .unwrap()
}

fn slice(ns: &str, svc: &str, ips: &[&str]) -> EndpointSlice {
    serde_json::from_value(json!({"metadata": {"name": format!("{svc}-x"), "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>()}))
    .unwrap()
}

/// The Gateway's Service with an address from the pool.
fn gateway_service(name: &str, ip: &str) -> core::Service {
    let mut s = service("infra", &plan::service_name(name), 80);
    s.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": ip}]}})).unwrap();
    s
}

fn base() -> Inputs {
    Inputs {
        classes: vec![class()],
        gateways: vec![gateway("gw", http())],
        services: vec![gateway_service("gw", "198.51.100.9"), service("app", "web", 80), service("app", "canary", 80)],
        slices: vec![slice("app", "web", &["10.244.1.5", "10.244.2.5"]), slice("app", "canary", &["10.244.1.9"])],
        ..Default::default()
    }
}

fn parent_conds(p: &Plan, route: &str) -> Vec<(String, String, String)> {
    let (_, _, parents, _) = p.routes.iter().find(|r| r.1 == route).expect("route status");
    parents[0]
        .1
        .iter()
        .map(|c| (c.type_.to_string(), if c.status { "True" } else { "False" }.to_string(), c.reason.to_string()))
        .collect()
}

fn cond_of(status: &Value, ty: &str) -> (String, String) {
    let c = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == ty).unwrap();
    (c["status"].as_str().unwrap().to_string(), c["reason"].as_str().unwrap().to_string())
}

fn gw_status<'a>(p: &'a Plan, key: &str) -> &'a Value {
    &p.gateways.iter().find(|g| g.0 == key).unwrap().1
}

fn req<'a>(
    host: &'a str,
    method: &'a str,
    path: &'a str,
    query: &'a str,
    headers: &'a Vec<(String, String)>,
) -> Request<'a> {
    Request { host, method, path, query, headers }
}

/// GatewayClassObservedGenerationBump, GatewayObservedGenerationBump: the class is accepted,
/// conditions carry the object's generation.
#[test]
fn gateway_class_and_gateway_are_accepted_with_their_generation() {
    let p = plan::plan(&base());
    assert_eq!(p.classes[0].0, "podpath");
    assert_eq!(
        (p.classes[0].1[0].type_, p.classes[0].1[0].status, p.classes[0].1[0].reason),
        ("Accepted", true, "Accepted")
    );
    let st = gw_status(&p, "infra/gw");
    assert_eq!(cond_of(st, "Accepted"), ("True".into(), "Accepted".into()));
    assert_eq!(cond_of(st, "Programmed"), ("True".into(), "Programmed".into()));
    assert_eq!(st["conditions"][0]["observedGeneration"], 2);
    assert_eq!(st["addresses"], json!([{"type": "IPAddress", "value": "198.51.100.9"}]));
    assert_eq!(
        st["listeners"][0]["supportedKinds"],
        json!([{"group": GROUP, "kind": "HTTPRoute"}, {"group": GROUP, "kind": "GRPCRoute"}])
    );
    // Another controller's class and its Gateways are left alone.
    let mut other = base();
    other.classes[0].spec.controller_name = "example.com/other".into();
    let p = plan::plan(&other);
    assert!(p.classes.is_empty() && p.gateways.is_empty() && p.services.is_empty());
}

/// A Gateway gets its address from a LoadBalancer Service of its own; until the pool gives one,
/// it is not programmed (GatewayStaticAddresses' AddressNotAssigned reason).
#[test]
fn a_gateway_waits_for_its_address() {
    let mut i = base();
    i.services.retain(|s| !plan::is_gateway_service(s) && s.metadata.name.as_deref() != Some("podpath-gateway-gw"));
    let p = plan::plan(&i);
    assert_eq!(p.services[0].metadata.name.as_deref(), Some("podpath-gateway-gw"));
    assert_eq!(p.services[0].spec.as_ref().unwrap().type_.as_deref(), Some("LoadBalancer"));
    assert!(plan::is_gateway_service(&p.services[0]));
    assert_eq!(cond_of(gw_status(&p, "infra/gw"), "Programmed"), ("False".into(), "AddressNotAssigned".into()));
    assert!(p.sites.is_empty());
}

/// GatewayInvalidTLSConfiguration, GatewayInvalidRouteKind, GatewayWithAttachedRoutes'
/// conflicts: listeners' conditions and the Gateway's ListenersNotValid.
#[test]
fn invalid_listeners_get_the_specs_reasons() {
    let mut i = base();
    i.gateways = vec![gateway(
        "gw",
        json!([
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "tls", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "missing"}]}},
            {"name": "tcp", "port": 9000, "protocol": "TCP"},
            {"name": "kinds", "port": 8080, "protocol": "HTTP", "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}},
            {"name": "clash", "port": 80, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "missing"}]}},
        ]),
    )];
    let p = plan::plan(&i);
    let st = gw_status(&p, "infra/gw");
    assert_eq!(cond_of(st, "Accepted"), ("True".into(), "ListenersNotValid".into()));
    let listener = |n: &str| st["listeners"].as_array().unwrap().iter().find(|l| l["name"] == n).unwrap().clone();
    assert_eq!(cond_of(&listener("tls"), "ResolvedRefs"), ("False".into(), "InvalidCertificateRef".into()));
    assert_eq!(cond_of(&listener("tcp"), "Accepted"), ("False".into(), "UnsupportedProtocol".into()));
    assert_eq!(cond_of(&listener("kinds"), "ResolvedRefs"), ("False".into(), "InvalidRouteKinds".into()));
    assert_eq!(listener("kinds")["supportedKinds"], json!([]));
    assert_eq!(cond_of(&listener("clash"), "Conflicted"), ("True".into(), "ProtocolConflict".into()));
    assert_eq!(cond_of(&listener("http"), "Conflicted"), ("True".into(), "ProtocolConflict".into()));
}

/// HTTPRouteSimpleSameNamespace, GatewayWithAttachedRoutes: an accepted route, resolved refs,
/// attachedRoutes counted; the rule's backends carry their endpoints.
#[test]
fn a_route_attaches_and_is_counted() {
    let mut i = base();
    i.http_routes = vec![route(
        "app",
        "web",
        "2026-11-27T10:00:00Z",
        json!({
        "parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}),
    )];
    let p = plan::plan(&i);
    assert_eq!(
        parent_conds(&p, "app/web"),
        [
            ("Accepted".into(), "True".into(), "Accepted".into()),
            ("ResolvedRefs".into(), "True".into(), "ResolvedRefs".into())
        ]
    );
    assert_eq!(gw_status(&p, "infra/gw")["listeners"][0]["attachedRoutes"], 1);
    let rule = &p.sites[0].listeners[0].rules[0];
    assert_eq!(
        rule.backends[0].endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        ["10.244.1.5:8080", "10.244.2.5:8080"]
    );
    let status = plan::route_status(
        &json!({"parents": [{"controllerName": "example.com/other", "parentRef": {"name": "x"}}]}),
        &p.routes[0].2,
        1,
    );
    assert_eq!(status["parents"].as_array().unwrap().len(), 2, "other controllers' parents stay");
}

/// HTTPRouteInvalidCrossNamespaceBackendRef and HTTPRouteReferenceGrant: a backend in another
/// namespace needs a ReferenceGrant there.
#[test]
fn a_cross_namespace_backend_needs_a_reference_grant() {
    let mut i = base();
    i.http_routes = vec![route(
        "shop",
        "web",
        "2026-11-27T10:00:00Z",
        json!({
        "parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"name": "web", "namespace": "app", "port": 80}]}]}),
    )];
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "shop/web")[1], ("ResolvedRefs".into(), "False".into(), "RefNotPermitted".into()));
    assert!(p.sites[0].listeners[0].rules[0].backends[0].problem.is_some());
    i.grants = vec![obj(json!({"metadata": {"name": "shop-to-app", "namespace": "app"},
        "spec": {"from": [{"group": GROUP, "kind": "HTTPRoute", "namespace": "shop"}], "to": [{"group": "", "kind": "Service"}]}}))];
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "shop/web")[1], ("ResolvedRefs".into(), "True".into(), "ResolvedRefs".into()));
}

/// HTTPRouteRequestMirror, HTTPRouteRequestMultipleMirrors, HTTPRouteRequestPercentageMirror:
/// mirrors resolve as backends do (endpoints, a ReferenceGrant across namespaces), with their
/// share of requests.
#[test]
fn mirrors_resolve_with_their_share() {
    let mut i = base();
    i.services.push(service("app", "shadow", 80));
    i.slices.push(slice("app", "shadow", &["10.244.2.7"]));
    i.http_routes = vec![route(
        "app",
        "web",
        "2026-11-27T10:00:00Z",
        json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"filters": [
            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}},
            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "canary", "port": 80}, "percent": 25}},
            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "web", "port": 80}, "fraction": {"numerator": 1, "denominator": 8}}}],
          "backendRefs": [{"name": "web", "port": 80}]}]}),
    )];
    let p = plan::plan(&i);
    let rule = &p.sites[0].listeners[0].rules[0];
    let got: Vec<(String, Vec<String>, f64)> = rule
        .mirrors
        .iter()
        .map(|m| (m.backend.service.clone(), m.backend.endpoints.iter().map(|e| e.to_string()).collect(), m.percent))
        .collect();
    assert_eq!(
        got,
        [
            ("app/shadow".to_string(), vec!["10.244.2.7:8080".to_string()], 100.0),
            ("app/canary".into(), vec!["10.244.1.9:8080".into()], 25.0),
            ("app/web".into(), vec!["10.244.1.5:8080".into(), "10.244.2.5:8080".into()], 12.5),
        ]
    );
    assert_eq!(parent_conds(&p, "app/web")[1], ("ResolvedRefs".into(), "True".into(), "ResolvedRefs".into()));
    // A mirror in another namespace without a grant: refused as a backend would be.
    i.http_routes[0] = route(
        "app",
        "web",
        "2026-11-27T10:00:00Z",
        json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "spy", "namespace": "other", "port": 80}}}],
          "backendRefs": [{"name": "web", "port": 80}]}]}),
    );
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "app/web")[1], ("ResolvedRefs".into(), "False".into(), "RefNotPermitted".into()));
    assert!(p.sites[0].listeners[0].rules[0].mirrors[0].backend.problem.is_some());
}

/// HTTPRouteInvalidNonExistentBackendRef, HTTPRouteInvalidBackendRefUnknownKind.
#[test]
fn missing_and_foreign_backends_are_reported() {
    let mut i = base();
    i.http_routes = vec![
        route(
            "app",
            "gone",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
            "rules": [{"backendRefs": [{"name": "nothing", "port": 80}]}]}),
        ),
        route(
            "app",
            "odd",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
            "rules": [{"backendRefs": [{"group": "example.com", "kind": "Bucket", "name": "b"}]}]}),
        ),
    ];
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "app/gone")[1], ("ResolvedRefs".into(), "False".into(), "BackendNotFound".into()));
    assert_eq!(parent_conds(&p, "app/odd")[1], ("ResolvedRefs".into(), "False".into(), "InvalidKind".into()));
}

/// HTTPRouteDisallowedKind / GatewayWithAttachedRoutes (allowedRoutes by namespace),
/// HTTPRouteInvalidParentRefNotMatchingSectionName, HTTPRouteHostnameIntersection's
/// NoMatchingListenerHostname.
#[test]
fn routes_a_listener_does_not_take_are_not_accepted() {
    let mut i = base();
    i.gateways =
        vec![gateway("gw", json!([{"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"}]))];
    i.namespaces = vec![serde_json::from_value(json!({"metadata": {"name": "app", "labels": {"team": "a"}}})).unwrap()];
    i.http_routes = vec![
        route(
            "app",
            "other-ns",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [{}]}),
        ),
        route(
            "infra",
            "no-section",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "sectionName": "nope"}], "rules": [{}]}),
        ),
        route(
            "infra",
            "hosts",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw"}], "hostnames": ["web.example.org"], "rules": [{}]}),
        ),
        route(
            "infra",
            "fine",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw"}], "hostnames": ["web.example.com"], "rules": [{}]}),
        ),
    ];
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "app/other-ns")[0].2, "NotAllowedByListeners");
    assert_eq!(parent_conds(&p, "infra/no-section")[0].2, "NoMatchingParent");
    assert_eq!(parent_conds(&p, "infra/hosts")[0].2, "NoMatchingListenerHostname");
    assert_eq!(parent_conds(&p, "infra/fine")[0].2, "Accepted");
    // A selector of namespaces admits the labelled one.
    i.gateways[0].spec.listeners[0].allowed_routes = Some(
        serde_json::from_value(json!({"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}}))
            .unwrap(),
    );
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "app/other-ns")[0].2, "Accepted");
}

fn site_with(routes: Vec<HttpRoute>) -> plan::Site {
    let mut i = base();
    i.http_routes = routes;
    plan::plan(&i).sites.remove(0)
}

fn to(site: &plan::Site, r: &Request<'_>) -> Option<(String, usize)> {
    route::route(site, r).map(|m| (m.rule.route.clone(), m.rule.index))
}

/// HTTPRouteMatching, HTTPRouteExactPathMatching, HTTPRouteMatchingAcrossRoutes,
/// HTTPRouteMethodMatching, HTTPRouteHeaderMatching, HTTPRouteQueryParamMatching,
/// HTTPRoutePathMatchOrder: the spec's precedence.
#[test]
fn requests_match_by_the_specs_precedence() {
    let site = site_with(vec![
        route(
            "app",
            "a",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}]},
                {"matches": [{"path": {"type": "Exact", "value": "/api/v1"}}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "method": "POST"}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "version", "value": "two"}]}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "queryParams": [{"name": "beta", "value": "1"}]}]},
                {"matches": [{"path": {"type": "RegularExpression", "value": "/re/[0-9]+"}}]},
                {"matches": [{"headers": [{"type": "RegularExpression", "name": "x-id", "value": "id-[a-z]+"}]}]},
            ]}),
        ),
        // An older route with the same match wins the tie.
        route(
            "app",
            "z-older",
            "2026-11-27T09:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/tie"}}]}]}),
        ),
        route(
            "app",
            "b-newer",
            "2026-11-27T11:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/tie"}}]}]}),
        ),
    ]);
    let none: Vec<(String, String)> = vec![];
    let h = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    assert_eq!(to(&site, &req("x", "GET", "/", "", &none)), Some(("app/a".into(), 0)));
    assert_eq!(
        to(&site, &req("x", "GET", "/apix", "", &none)),
        Some(("app/a".into(), 0)),
        "a prefix matches whole segments"
    );
    assert_eq!(to(&site, &req("x", "GET", "/api/x", "", &none)), Some(("app/a".into(), 1)));
    assert_eq!(to(&site, &req("x", "GET", "/api/v1", "", &none)), Some(("app/a".into(), 2)), "Exact before any prefix");
    assert_eq!(to(&site, &req("x", "POST", "/api/x", "", &none)), Some(("app/a".into(), 3)), "a method before headers");
    assert_eq!(to(&site, &req("x", "GET", "/api/x", "", &h("Version", "two"))), Some(("app/a".into(), 4)));
    assert_eq!(to(&site, &req("x", "GET", "/api/x", "beta=1", &none)), Some(("app/a".into(), 5)));
    assert_eq!(to(&site, &req("x", "GET", "/re/42", "", &none)), Some(("app/a".into(), 6)));
    assert_eq!(to(&site, &req("x", "GET", "/other", "", &h("x-id", "id-abc"))), Some(("app/a".into(), 7)));
    assert_eq!(to(&site, &req("x", "GET", "/tie/1", "", &none)), Some(("app/z-older".into(), 0)));
}

/// HTTPRouteHostnameIntersection, HTTPRouteListenerHostnameMatching: the most specific
/// listener, then the routes whose hostnames take the host.
#[test]
fn hostnames_pick_the_listener_and_the_route() {
    let mut i = base();
    i.gateways = vec![gateway(
        "gw",
        json!([
            {"name": "any", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "wild", "port": 80, "protocol": "HTTP", "hostname": "*.example.com", "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "exact", "port": 80, "protocol": "HTTP", "hostname": "bar.example.com", "allowedRoutes": {"namespaces": {"from": "All"}}},
        ]),
    )];
    i.http_routes = vec![
        route(
            "app",
            "wild",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "wild"}], "rules": [{}]}),
        ),
        route(
            "app",
            "exact",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "exact"}], "rules": [{}]}),
        ),
        route(
            "app",
            "any",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "any"}], "hostnames": ["very.specific.org", "*.org"], "rules": [{}]}),
        ),
    ];
    let site = plan::plan(&i).sites.remove(0);
    let none: Vec<(String, String)> = vec![];
    assert_eq!(to(&site, &req("bar.example.com", "GET", "/", "", &none)), Some(("app/exact".into(), 0)));
    assert_eq!(to(&site, &req("foo.example.com", "GET", "/", "", &none)), Some(("app/wild".into(), 0)));
    assert_eq!(to(&site, &req("a.b.org", "GET", "/", "", &none)), Some(("app/any".into(), 0)));
    assert_eq!(to(&site, &req("example.net", "GET", "/", "", &none)), None, "no route: the gateway answers 404");
}

/// HTTPRouteListenerHostnameMatching (its hosts and answers), with the multi-label wildcard;
/// HTTPRouteInvalidParentRefNotMatchingListenerPort; HTTPRouteHostnameIntersection's wildcard
/// route on an exact listener.
#[test]
fn listener_hostnames_ports_and_wildcards() {
    let mut i = base();
    let l = |name: &str, host: &str| json!({"name": name, "port": 80, "protocol": "HTTP", "hostname": host});
    i.gateways = vec![gateway(
        "gw",
        json!([
            l("l1", "bar.com"),
            l("l2", "foo.bar.com"),
            l("l3", "*.bar.com"),
            l("l4", "*.foo.com"),
            l("l5", "very.specific.com")
        ]),
    )];
    let to_section = |name: &str, sections: &[&str], hostnames: Value| {
        let parents: Vec<Value> = sections.iter().map(|s| json!({"name": "gw", "sectionName": s})).collect();
        route(
            "infra",
            name,
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": parents, "hostnames": hostnames, "rules": [{}]}),
        )
    };
    i.http_routes = vec![
        to_section("v1", &["l1"], json!([])),
        to_section("v2", &["l2"], json!([])),
        to_section("v3", &["l3", "l4"], json!([])),
        to_section("wild", &["l5"], json!(["*.specific.com"])),
        route(
            "infra",
            "port",
            "2026-11-27T10:00:00Z",
            json!({"parentRefs": [{"name": "gw", "port": 81}], "rules": [{}]}),
        ),
    ];
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "infra/port")[0], ("Accepted".into(), "False".into(), "NoMatchingParent".into()));
    assert_eq!(parent_conds(&p, "infra/wild")[0].2, "Accepted");
    let site = p.sites.into_iter().next().unwrap();
    let none: Vec<(String, String)> = vec![];
    for (host, want) in [
        ("bar.com", Some("infra/v1")),
        ("foo.bar.com", Some("infra/v2")),
        ("baz.bar.com", Some("infra/v3")),
        ("boo.bar.com", Some("infra/v3")),
        ("multiple.prefixes.bar.com", Some("infra/v3")),
        ("multiple.prefixes.foo.com", Some("infra/v3")),
        ("foo.com", None),
        ("no.matching.host", None),
        ("very.specific.com", Some("infra/wild")),
        ("other.specific.com", None),
    ] {
        let got = to(&site, &req(host, "GET", "/", "", &none)).map(|(r, _)| r);
        assert_eq!(got.as_deref(), want, "{host}");
    }
}

/// HTTPRouteWeight: backends share requests by weight; a weight of 0 gets none.
#[test]
fn weights_share_the_requests() {
    let site = site_with(vec![route(
        "app",
        "w",
        "2026-11-27T10:00:00Z",
        json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"name": "web", "port": 80, "weight": 90}, {"name": "canary", "port": 80, "weight": 10},
                                   {"name": "web", "port": 80, "weight": 0}]}]}),
    )]);
    let backends = &site.listeners[0].rules[0].backends;
    assert_eq!(route::total_weight(backends), 100);
    let mut counts = std::collections::BTreeMap::new();
    for roll in 0..1000 {
        *counts.entry(route::pick(backends, roll).unwrap().service.clone()).or_insert(0) += 1;
    }
    assert_eq!(counts["app/web"], 900);
    assert_eq!(counts["app/canary"], 100);
    assert!(route::pick(&backends[2..], 5).is_none());
}

/// HTTPRouteRedirectScheme, HTTPRouteRedirectHostAndStatus, HTTPRouteRedirectPort,
/// HTTPRouteRedirectPath, HTTPRouteRewritePath, HTTPRouteRewriteHost,
/// HTTPRouteRequestHeaderModifier, HTTPRouteResponseHeaderModifier, HTTPRouteRequestMirror.
#[test]
fn filters_redirect_rewrite_and_modify() {
    static NONE: Vec<(String, String)> = Vec::new();
    let r = |h: &'static str, p: &'static str, q: &'static str| req(h, "GET", p, q, &NONE);
    let filter = |v: Value| -> Vec<HttpRouteFilter> { serde_json::from_value(v).unwrap() };
    let prefix = plan::PathRule::Prefix("/old".into());
    let e = route::effects(
        &filter(json!([{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "statusCode": 301}}])),
        &prefix,
        &r("web.example", "/old/a", "x=1"),
        false,
        80,
        "app",
    );
    assert_eq!(e.redirect, Some((301, "https://web.example/old/a?x=1".into())));
    let e = route::effects(
        &filter(json!([{"type": "RequestRedirect", "requestRedirect": {"hostname": "new.example", "port": 8443}}])),
        &prefix,
        &r("web.example", "/old", ""),
        false,
        80,
        "app",
    );
    assert_eq!(e.redirect, Some((302, "http://new.example:8443/old".into())));
    let e = route::effects(
        &filter(
            json!([{"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]),
        ),
        &prefix,
        &r("w", "/old/a/b", ""),
        false,
        8080,
        "app",
    );
    assert_eq!(e.redirect, Some((302, "http://w:8080/new/a/b".into())));
    let e = route::effects(
        &filter(
            json!([{"type": "URLRewrite", "urlRewrite": {"hostname": "internal", "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}]),
        ),
        &prefix,
        &r("w", "/old/a", "q=2"),
        false,
        80,
        "app",
    );
    assert_eq!((e.host.as_deref(), e.path.as_deref()), (Some("internal"), Some("/a?q=2")));
    let e = route::effects(
        &filter(
            json!([{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/one"}}}]),
        ),
        &prefix,
        &r("w", "/old/a", ""),
        false,
        80,
        "app",
    );
    assert_eq!(e.path.as_deref(), Some("/one"));
    let e = route::effects(
        &filter(json!([{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}])),
        &prefix,
        &r("w", "/old", ""),
        false,
        80,
        "app",
    );
    assert_eq!(e.mirrors, [("app/shadow".to_string(), 80)]);
    let mods: HeaderModifier = serde_json::from_value(json!({"set": [{"name": "X-Env", "value": "lab"}], "add": [{"name": "x-tag", "value": "b"}], "remove": ["x-drop"]})).unwrap();
    let mut headers = hyper::HeaderMap::new();
    for (k, v) in [("x-env", "prod"), ("x-tag", "a"), ("x-drop", "1")] {
        headers.insert(k, v.parse().unwrap());
    }
    route::modify_headers(&mut headers, &[mods]);
    let got: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap())).collect();
    assert_eq!(got, [("x-env", "lab"), ("x-tag", "a,b")]);
}

/// GRPCRouteExactMethodMatching, GRPCRouteHeaderMatching: a method match is a path of
/// `/service/method`.
#[test]
fn grpc_routes_match_service_and_method() {
    let mut i = base();
    i.grpc_routes = vec![obj(
        json!({"metadata": {"name": "echo", "namespace": "app", "creationTimestamp": "2026-11-27T10:00:00Z"},
        "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [
            {"matches": [{"method": {"service": "echo.Echo", "method": "Say"}}], "backendRefs": [{"name": "web", "port": 80}]},
            {"matches": [{"method": {"service": "echo.Echo"}}], "backendRefs": [{"name": "canary", "port": 80}]}]}}),
    )];
    let p = plan::plan(&i);
    assert_eq!(parent_conds(&p, "app/echo")[0].2, "Accepted");
    let site = &p.sites[0];
    let none: Vec<(String, String)> = vec![];
    let m = route::route(site, &req("x", "POST", "/echo.Echo/Say", "", &none)).unwrap();
    assert_eq!((m.rule.kind, m.rule.index), (plan::RouteKind::Grpc, 0));
    let m = route::route(site, &req("x", "POST", "/echo.Echo/Other", "", &none)).unwrap();
    assert_eq!(m.rule.index, 1);
}

/// Conditions keep their transition time while their status holds.
/// The spec's RouteParentStatus rule (no conformance test of its own): a route whose parentRef
/// no longer names a Gateway of this controller, or whose Gateway is gone, loses this
/// controller's entries in its status; other controllers' stay.
#[test]
fn a_route_that_left_its_gateway_loses_our_status_entries() {
    let mut i = base();
    let attached = json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]});
    i.http_routes = vec![route("app", "web", "2026-11-27T10:00:00Z", attached)];
    let p = plan::plan(&i);
    let (_, _, parents, generation) = &p.routes[0];
    let theirs = json!({"parentRef": {"name": "other"}, "controllerName": "example.com/other", "conditions": []});
    let mut old = plan::route_status(&json!({"parents": [theirs.clone()]}), parents, *generation);
    assert!(plan::has_our_parents(&old));
    assert_eq!(old["parents"].as_array().unwrap().len(), 2);
    // The parentRef now names a Gateway that does not exist: no status of ours is planned.
    i.http_routes = vec![route(
        "app",
        "web",
        "2026-11-27T10:00:00Z",
        json!({"parentRefs": [{"name": "gone", "namespace": "infra"}], "rules": []}),
    )];
    assert!(plan::plan(&i).routes.is_empty());
    old = plan::route_status(&old, &[], 2);
    assert!(!plan::has_our_parents(&old));
    assert_eq!(old["parents"], json!([theirs]));
}

#[test]
fn transition_times_survive_unchanged_conditions() {
    let p = plan::plan(&base());
    let mut first = p.gateways[0].1.clone();
    plan::merge_conditions(&Value::Null, &mut first, "2026-11-27T10:00:00Z");
    let mut again = p.gateways[0].1.clone();
    plan::merge_conditions(&first, &mut again, "2026-11-27T11:00:00Z");
    assert_eq!(again["conditions"][0]["lastTransitionTime"], "2026-11-27T10:00:00Z");
    assert_eq!(again["listeners"][0]["conditions"][0]["lastTransitionTime"], "2026-11-27T10:00:00Z");
}
