//! The lab's Gateway API controller, decided purely: from the GatewayClasses, Gateways, routes,
//! ReferenceGrants, Services, EndpointSlices, Secrets and Namespaces the API holds, what the
//! gateway serves ([`Site`]s), the LoadBalancer Service each Gateway gets its address from,
//! and every status as the spec words its conditions and reasons.
//!
//! Backends are reached straight at their endpoints (the pods' addresses, routed on the
//! gateway to each node's pod CIDR), as container-native load balancers and in-cluster
//! gateways reach them: HTTPRoute backends are usually ClusterIP Services, which have no
//! NodePort for the Ingress path's node-port hop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use api::Codec;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};

use super::types::*;

/// One condition as the plan wants it (its transition time is kept by [`merge_conditions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

fn cond(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Cond {
    Cond { type_, status, reason, message: message.into() }
}

/// Everything the controller reads.
#[derive(Debug, Default, Clone)]
pub struct Inputs {
    pub classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    pub http_routes: Vec<HttpRoute>,
    pub grpc_routes: Vec<GrpcRoute>,
    pub grants: Vec<ReferenceGrant>,
    pub services: Vec<core::Service>,
    pub slices: Vec<EndpointSlice>,
    pub secrets: Vec<core::Secret>,
    pub namespaces: Vec<core::Namespace>,
}

/// A regular expression compiled once, when the plan is made (a request only runs it), and
/// anchored at both ends as the Gateway API's matches are. An expression that does not compile
/// matches nothing.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub source: String,
    compiled: Option<regex::Regex>,
}

impl Pattern {
    pub fn new(source: impl Into<String>) -> Pattern {
        let source = source.into();
        let compiled = regex::Regex::new(&format!("^(?:{source})$")).ok();
        Pattern { source, compiled }
    }

    pub fn is_match(&self, s: &str) -> bool {
        self.compiled.as_ref().is_some_and(|r| r.is_match(s))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.source == other.source
    }
}

/// How a rule matches a request path.
#[derive(Debug, Clone, PartialEq)]
pub enum PathRule {
    Exact(String),
    Prefix(String),
    Regex(Pattern),
}

/// How a header's or query parameter's value must look.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueRule {
    Exact(String),
    Regex(Pattern),
}

/// A header (name compared without case) or query parameter match, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedMatch {
    pub name: String,
    pub value: ValueRule,
}

impl NamedMatch {
    fn from_spec(m: ValueMatch) -> NamedMatch {
        let value = match m.type_.as_deref() {
            Some("RegularExpression") => ValueRule::Regex(Pattern::new(m.value)),
            _ => ValueRule::Exact(m.value),
        };
        NamedMatch { name: m.name, value }
    }
}

/// One match of a rule, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub path: PathRule,
    pub method: Option<String>,
    pub headers: Vec<NamedMatch>,
    pub query: Vec<NamedMatch>,
}

/// A RequestMirror filter, resolved: the backend that gets a copy of the requests, and the
/// share of them (percent, 0–100).
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorTo {
    pub backend: Backend,
    pub percent: f64,
}

/// One backend of a rule: a Service port and its ready endpoints, or why it is unusable
/// (requests its weight sends get a 500, as the spec asks).
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// `namespace/name` of the Service.
    pub service: String,
    pub port: i32,
    pub weight: u32,
    pub endpoints: Vec<SocketAddr>,
    pub problem: Option<String>,
    pub filters: Vec<HttpRouteFilter>,
    /// The RequestMirror filters among `filters`, resolved.
    pub mirrors: Vec<MirrorTo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    Http,
    Grpc,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        }
    }
}

/// One rule of a route attached to a listener.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub kind: RouteKind,
    /// `namespace/name` of the route.
    pub route: String,
    pub created: String,
    pub index: usize,
    pub name: Option<String>,
    /// The route's hostnames that the listener accepts (empty: any the listener takes).
    pub hostnames: Vec<String>,
    pub matches: Vec<Match>,
    pub filters: Vec<HttpRouteFilter>,
    pub backends: Vec<Backend>,
    /// The RequestMirror filters among `filters`, resolved.
    pub mirrors: Vec<MirrorTo>,
    pub timeouts: Option<Timeouts>,
}

/// A listener as served.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerSite {
    pub name: String,
    pub hostname: Option<String>,
    pub https: bool,
    pub rules: Vec<Rule>,
}

/// A certificate a listener serves (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cert {
    pub hostname: Option<String>,
    pub secret: String,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// One port of a Gateway's address.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// `namespace/name` of the Gateway.
    pub gateway: String,
    pub vip: IpAddr,
    pub port: u16,
    pub https: bool,
    pub certs: Vec<Cert>,
    pub listeners: Vec<ListenerSite>,
}

/// A route's parents as this controller sees them: (resource, `namespace/name`, each parent
/// with its conditions, the route's generation).
pub type RouteStatus = (&'static str, String, Vec<(ParentRef, Vec<Cond>)>, i64);

/// One rule of a route, whatever its kind: (name, matches, filters, backends, timeouts).
type AnyRule<'a> = (Option<String>, Vec<Match>, Vec<HttpRouteFilter>, &'a [BackendRef], Option<Timeouts>);

/// What the controller wants.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    /// GatewayClass name → conditions.
    pub classes: Vec<(String, Vec<Cond>, i64)>,
    /// Gateway key → its status.
    pub gateways: Vec<(String, Value)>,
    /// (resource, route key) → the parents this controller owns, each with its conditions.
    pub routes: Vec<RouteStatus>,
    /// The LoadBalancer Service of each Gateway.
    pub services: Vec<core::Service>,
    pub sites: Vec<Site>,
}

/// The label the Gateway's Service carries.
pub const GATEWAY_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "podpath-gateway";

/// The name of a Gateway's Service.
pub fn service_name(gateway: &str) -> String {
    let name = format!("podpath-gateway-{gateway}");
    name.chars().take(63).collect::<String>().trim_end_matches('-').to_string()
}

/// Whether a Service is one this controller made (the passthrough load balancer leaves it).
pub fn is_gateway_service(s: &core::Service) -> bool {
    s.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|m| m == MANAGER)
}

fn key_of(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn svc_key(s: &core::Service) -> String {
    key_of(s.metadata.namespace.as_deref().unwrap_or("default"), s.metadata.name.as_deref().unwrap_or(""))
}

/// Whether a hostname (maybe `*.x`) and another intersect.
pub fn hostnames_intersect(a: &str, b: &str) -> bool {
    let wild = |w: &str, h: &str| {
        w.strip_prefix("*.").is_some_and(|s| {
            h.ends_with(&format!(".{s}"))
                || h.strip_prefix("*.").is_some_and(|hs| hs.ends_with(&format!(".{s}")) || hs == s)
        })
    };
    a.eq_ignore_ascii_case(b) || wild(a, b) || wild(b, a)
}

/// Whether a request's host matches a hostname (maybe `*.x`: one or more labels under x).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.to_ascii_lowercase().ends_with(&format!(".{}", suffix.to_ascii_lowercase()))
        }
        None => pattern.eq_ignore_ascii_case(host),
    }
}

struct Ctx<'a> {
    inputs: &'a Inputs,
    services: BTreeMap<String, &'a core::Service>,
}

impl Ctx<'_> {
    /// Whether a ReferenceGrant in `to_ns` lets a `from_kind` of `from_ns` refer to a
    /// `to_kind` (group `to_group`) named `name` there.
    fn granted(&self, from_kind: &str, from_ns: &str, to_group: &str, to_kind: &str, to_ns: &str, name: &str) -> bool {
        from_ns == to_ns
            || self.inputs.grants.iter().filter(|g| g.metadata.namespace == to_ns).any(|g| {
                g.spec.from.iter().any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns)
                    && g.spec.to.iter().any(|t| {
                        t.group == to_group && t.kind == to_kind && t.name.as_deref().is_none_or(|n| n == name)
                    })
            })
    }

    fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        self.inputs
            .namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// The ready endpoints of a Service port (`port` as the route names it).
    fn endpoints(&self, svc: &core::Service, port: i32) -> Vec<SocketAddr> {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let Some(sp) =
            svc.spec.as_ref().and_then(|s| s.ports.as_ref()).and_then(|ps| ps.iter().find(|p| p.port == port))
        else {
            return vec![];
        };
        let mut out = Vec::new();
        for slice in self.inputs.slices.iter().filter(|s| {
            s.metadata.namespace.as_deref() == Some(ns)
                && s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).map(String::as_str)
                    == Some(name)
        }) {
            let target = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().unwrap_or("") == sp.name.as_deref().unwrap_or(""));
            let Some(tp) = target.and_then(|p| p.port) else { continue };
            for ep in &slice.endpoints {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for a in &ep.addresses {
                    if let Ok(ip) = a.parse::<IpAddr>() {
                        out.push(SocketAddr::new(ip, tp as u16));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// A listener checked: its conditions, supported kinds and whether it serves.
struct CheckedListener<'a> {
    l: &'a Listener,
    conds: Vec<Cond>,
    kinds: Vec<RouteGroupKind>,
    ok: bool,
    certs: Vec<Cert>,
}

const SUPPORTED_PROTOCOLS: &[&str] = &["HTTP", "HTTPS"];

fn check_listeners<'a>(ctx: &Ctx<'_>, gw: &'a Gateway) -> Vec<CheckedListener<'a>> {
    let ns = &gw.metadata.namespace;
    let listeners = &gw.spec.listeners;
    listeners
        .iter()
        .map(|l| {
            let mut conds = Vec::new();
            let mut ok = true;
            // Conflicts with the Gateway's other listeners on the same port.
            let same_port: Vec<&Listener> = listeners.iter().filter(|o| o.port == l.port && o.name != l.name).collect();
            let protocol_conflict = same_port.iter().any(|o| o.protocol != l.protocol);
            let hostname_conflict = same_port.iter().any(|o| o.protocol == l.protocol && o.hostname == l.hostname);
            let supported = SUPPORTED_PROTOCOLS.contains(&l.protocol.as_str());
            // Route kinds: HTTPRoute and GRPCRoute on HTTP and HTTPS.
            let wanted = l.allowed_routes.as_ref().map(|a| a.kinds.clone()).unwrap_or_default();
            let default_kinds = vec![
                RouteGroupKind { group: Some(GROUP.into()), kind: "HTTPRoute".into() },
                RouteGroupKind { group: Some(GROUP.into()), kind: "GRPCRoute".into() },
            ];
            let (kinds, bad_kinds): (Vec<RouteGroupKind>, Vec<RouteGroupKind>) = if wanted.is_empty() {
                (default_kinds, vec![])
            } else {
                wanted.into_iter().partition(|k| {
                    k.group.as_deref().unwrap_or(GROUP) == GROUP && (k.kind == "HTTPRoute" || k.kind == "GRPCRoute")
                })
            };
            let kinds: Vec<RouteGroupKind> =
                kinds.into_iter().map(|k| RouteGroupKind { group: Some(GROUP.into()), kind: k.kind }).collect();
            if !supported {
                ok = false;
                conds.push(cond(
                    "Accepted",
                    false,
                    "UnsupportedProtocol",
                    format!("protocol {} is not supported by the podpath gateway (HTTP and HTTPS are)", l.protocol),
                ));
            } else if !(1..=65535).contains(&l.port) {
                ok = false;
                conds.push(cond("Accepted", false, "PortUnavailable", format!("port {} cannot be served", l.port)));
            } else {
                conds.push(cond("Accepted", true, "Accepted", "Listener is accepted"));
            }
            if protocol_conflict {
                ok = false;
                conds.push(cond(
                    "Conflicted",
                    true,
                    "ProtocolConflict",
                    "another listener uses this port with another protocol",
                ));
            } else if hostname_conflict {
                ok = false;
                conds.push(cond(
                    "Conflicted",
                    true,
                    "HostnameConflict",
                    "another listener uses this port, protocol and hostname",
                ));
            } else {
                conds.push(cond("Conflicted", false, "NoConflicts", "No conflicts"));
            }
            // Certificates of HTTPS listeners.
            let mut certs = Vec::new();
            let mut refs_problem: Option<(&'static str, String)> = None;
            if !bad_kinds.is_empty() {
                let names: Vec<String> = bad_kinds.iter().map(|k| k.kind.clone()).collect();
                refs_problem = Some(("InvalidRouteKinds", format!("route kinds not supported: {}", names.join(", "))));
            }
            if l.protocol == "HTTPS" && supported {
                let tls = l.tls.clone().unwrap_or_default();
                if tls.mode.as_deref().unwrap_or("Terminate") != "Terminate" {
                    ok = false;
                    refs_problem =
                        Some(("InvalidCertificateRef", "only TLS mode Terminate is supported on HTTPS".into()));
                } else if tls.certificate_refs.is_empty() {
                    ok = false;
                    refs_problem = Some(("InvalidCertificateRef", "an HTTPS listener needs a certificateRef".into()));
                }
                for r in &tls.certificate_refs {
                    let rns = r.namespace.clone().unwrap_or_else(|| ns.clone());
                    let kind_ok = r.group.as_deref().unwrap_or("").is_empty()
                        && r.kind.as_deref().unwrap_or("Secret") == "Secret";
                    if !kind_ok {
                        refs_problem = Some((
                            "InvalidCertificateRef",
                            format!("{}/{} is not a Secret", r.kind.clone().unwrap_or_default(), r.name),
                        ));
                        ok = false;
                        continue;
                    }
                    if !ctx.granted("Gateway", ns, "", "Secret", &rns, &r.name) {
                        refs_problem = Some((
                            "RefNotPermitted",
                            format!("no ReferenceGrant in {rns} lets Gateways of {ns} use Secret {}", r.name),
                        ));
                        ok = false;
                        continue;
                    }
                    let secret = ctx.inputs.secrets.iter().find(|s| {
                        s.metadata.namespace.as_deref() == Some(rns.as_str())
                            && s.metadata.name.as_deref() == Some(r.name.as_str())
                    });
                    let data = secret.and_then(|s| s.data.as_ref());
                    match data.and_then(|d| Some((d.get("tls.crt")?, d.get("tls.key")?))) {
                        Some((c, k)) if secret.and_then(|s| s.type_.as_deref()) == Some("kubernetes.io/tls") => certs
                            .push(Cert {
                                hostname: l.hostname.clone(),
                                secret: key_of(&rns, &r.name),
                                cert_pem: c.0.clone(),
                                key_pem: k.0.clone(),
                            }),
                        _ => {
                            refs_problem = Some((
                                "InvalidCertificateRef",
                                format!("Secret {rns}/{} is missing or not a kubernetes.io/tls Secret", r.name),
                            ));
                            ok = false;
                        }
                    }
                }
            }
            match refs_problem {
                Some((reason, message)) => conds.push(cond("ResolvedRefs", false, reason, message)),
                None => conds.push(cond("ResolvedRefs", true, "ResolvedRefs", "All references are resolved")),
            }
            CheckedListener { l, conds, kinds, ok, certs }
        })
        .collect()
}

/// Whether a listener admits routes of `kind` from namespace `route_ns`.
fn allows(ctx: &Ctx<'_>, gw_ns: &str, c: &CheckedListener<'_>, kind: RouteKind, route_ns: &str) -> bool {
    if !c.kinds.iter().any(|k| k.kind == kind.as_str()) {
        return false;
    }
    let from = c.l.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref());
    match from.and_then(|f| f.from.as_deref()).unwrap_or("Same") {
        "All" => true,
        "Selector" => {
            let labels = ctx.namespace_labels(route_ns);
            from.and_then(|f| f.selector.as_ref()).is_some_and(|s| api::apps::selector_matches(s, Some(&labels)))
        }
        _ => gw_ns == route_ns,
    }
}

/// A route's parts the plan needs, whatever its kind.
struct AnyRoute<'a> {
    kind: RouteKind,
    meta: &'a Meta,
    parents: &'a [ParentRef],
    hostnames: &'a [String],
    rules: Vec<AnyRule<'a>>,
}

fn http_matches(r: &HttpRouteRule) -> Vec<Match> {
    let ms = if r.matches.is_empty() { vec![HttpRouteMatch::default()] } else { r.matches.clone() };
    ms.into_iter()
        .map(|m| {
            let p = m.path.unwrap_or_default();
            let value = p.value.unwrap_or_else(|| "/".into());
            let path = match p.type_.as_deref().unwrap_or("PathPrefix") {
                "Exact" => PathRule::Exact(value),
                "RegularExpression" => PathRule::Regex(Pattern::new(value)),
                _ => PathRule::Prefix(value),
            };
            Match {
                path,
                method: m.method,
                headers: m.headers.into_iter().map(NamedMatch::from_spec).collect(),
                query: m.query_params.into_iter().map(NamedMatch::from_spec).collect(),
            }
        })
        .collect()
}

fn grpc_matches(r: &GrpcRouteRule) -> Vec<Match> {
    let ms = if r.matches.is_empty() { vec![GrpcRouteMatch::default()] } else { r.matches.clone() };
    ms.into_iter()
        .map(|m| {
            let mm = m.method.unwrap_or_default();
            let regex = mm.type_.as_deref() == Some("RegularExpression");
            let path = match (mm.service, mm.method) {
                (Some(s), Some(meth)) if regex => PathRule::Regex(Pattern::new(format!("/{s}/{meth}"))),
                (Some(s), None) if regex => PathRule::Regex(Pattern::new(format!("/{s}/[^/]+"))),
                (None, Some(meth)) if regex => PathRule::Regex(Pattern::new(format!("/[^/]+/{meth}"))),
                (Some(s), Some(meth)) => PathRule::Exact(format!("/{s}/{meth}")),
                (Some(s), None) => PathRule::Prefix(format!("/{s}/")),
                (None, Some(meth)) => PathRule::Regex(Pattern::new(format!("/[^/]+/{}", regex_escape(&meth)))),
                (None, None) => PathRule::Prefix("/".into()),
            };
            Match {
                path,
                method: Some("POST".into()),
                headers: m.headers.into_iter().map(NamedMatch::from_spec).collect(),
                query: vec![],
            }
        })
        .collect()
}

fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_string() } else { format!("\\{c}") }).collect()
}

/// The status of one parent of a route and, when accepted, the listeners it attaches to.
fn attach(
    ctx: &Ctx<'_>,
    route: &AnyRoute<'_>,
    parent: &ParentRef,
    gw: &Gateway,
    checked: &[CheckedListener<'_>],
) -> (Cond, Vec<(String, Vec<String>)>) {
    let rns = &route.meta.namespace;
    let candidates: Vec<&CheckedListener<'_>> = checked
        .iter()
        .filter(|c| parent.section_name.as_deref().is_none_or(|s| s == c.l.name))
        .filter(|c| parent.port.is_none_or(|p| p == c.l.port))
        .collect();
    if candidates.is_empty() {
        let what = parent
            .section_name
            .as_deref()
            .map(|s| format!("no listener named {s}"))
            .unwrap_or_else(|| "no listener on that port".into());
        return (
            cond("Accepted", false, "NoMatchingParent", format!("{what} on Gateway {}", gw.metadata.key())),
            vec![],
        );
    }
    let allowed: Vec<&&CheckedListener<'_>> =
        candidates.iter().filter(|c| c.ok && allows(ctx, &gw.metadata.namespace, c, route.kind, rns)).collect();
    if allowed.is_empty() {
        return (
            cond(
                "Accepted",
                false,
                "NotAllowedByListeners",
                "no listener of the Gateway allows this route (kind, namespace or listener state)",
            ),
            vec![],
        );
    }
    let mut out = Vec::new();
    for c in allowed {
        let hosts: Vec<String> = match (&c.l.hostname, route.hostnames.is_empty()) {
            (_, true) => vec![],
            (None, false) => route.hostnames.to_vec(),
            (Some(lh), false) => route
                .hostnames
                .iter()
                .filter(|h| hostnames_intersect(lh, h))
                .map(|h| if h.starts_with("*.") && !lh.starts_with("*.") { lh.clone() } else { h.clone() })
                .collect(),
        };
        if !route.hostnames.is_empty() && hosts.is_empty() {
            continue;
        }
        out.push((c.l.name.clone(), hosts));
    }
    if out.is_empty() {
        return (
            cond("Accepted", false, "NoMatchingListenerHostname", "no listener hostname matches the route's hostnames"),
            vec![],
        );
    }
    (cond("Accepted", true, "Accepted", "Route is accepted"), out)
}

fn backends(
    ctx: &Ctx<'_>,
    route: &AnyRoute<'_>,
    refs: &[BackendRef],
) -> (Vec<Backend>, Option<(&'static str, String)>) {
    let rns = &route.meta.namespace;
    let mut problem = None;
    let mut out = Vec::new();
    for b in refs {
        let ns = b.namespace.clone().unwrap_or_else(|| rns.clone());
        let service = key_of(&ns, &b.name);
        let weight = b.weight.unwrap_or(1).max(0) as u32;
        let port = b.port.unwrap_or(0);
        let mut bad = |reason: &'static str, m: String| {
            problem.get_or_insert((reason, m.clone()));
            Some(m)
        };
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        let issue = if !group.is_empty() || kind != "Service" {
            bad("InvalidKind", format!("backend {kind} {} is not a Service", b.name))
        } else if !ctx.granted(route.kind.as_str(), rns, "", "Service", &ns, &b.name) {
            bad(
                "RefNotPermitted",
                format!("no ReferenceGrant in {ns} lets {}s of {rns} use Service {}", route.kind.as_str(), b.name),
            )
        } else {
            match ctx.services.get(&service) {
                None => bad("BackendNotFound", format!("Service {service} not found")),
                Some(svc) if b.port.is_none() => {
                    let _ = svc;
                    bad("BackendNotFound", format!("backend {service} needs a port"))
                }
                Some(svc) => {
                    let has = svc
                        .spec
                        .as_ref()
                        .and_then(|s| s.ports.as_ref())
                        .is_some_and(|ps| ps.iter().any(|p| p.port == port));
                    if has {
                        None
                    } else {
                        bad("BackendNotFound", format!("Service {service} has no port {port}"))
                    }
                }
            }
        };
        let endpoints = match (&issue, ctx.services.get(&service)) {
            (None, Some(svc)) => ctx.endpoints(svc, port),
            _ => vec![],
        };
        let (mirrors, mirror_problem) = mirrors(ctx, route, &b.filters);
        if let Some(p) = mirror_problem {
            problem.get_or_insert(p);
        }
        out.push(Backend { service, port, weight, endpoints, problem: issue, filters: b.filters.clone(), mirrors });
    }
    (out, problem)
}

/// The RequestMirror filters of `filters`, their backends resolved as backendRefs are (a
/// cross-namespace one needs a ReferenceGrant too).
fn mirrors(
    ctx: &Ctx<'_>,
    route: &AnyRoute<'_>,
    filters: &[HttpRouteFilter],
) -> (Vec<MirrorTo>, Option<(&'static str, String)>) {
    let mut out = Vec::new();
    let mut problem = None;
    for m in filters.iter().filter(|f| f.type_ == "RequestMirror").filter_map(|f| f.request_mirror.as_ref()) {
        let r = &m.backend_ref;
        let as_ref = BackendRef {
            group: r.group.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            namespace: r.namespace.clone(),
            port: r.port,
            weight: Some(1),
            filters: vec![],
        };
        let (mut resolved, p) = backends(ctx, route, std::slice::from_ref(&as_ref));
        if let Some(p) = p {
            problem.get_or_insert(p);
        }
        // `percent`, else `fraction` (denominator 100 by default), else every request.
        let percent = match (m.percent, &m.fraction) {
            (Some(p), _) => p as f64,
            (None, Some(f)) if f.denominator.unwrap_or(100) > 0 => {
                100.0 * f.numerator as f64 / f.denominator.unwrap_or(100) as f64
            }
            (None, Some(_)) => 0.0,
            (None, None) => 100.0,
        };
        if let Some(backend) = resolved.pop() {
            out.push(MirrorTo { backend, percent: percent.clamp(0.0, 100.0) });
        }
    }
    (out, problem)
}

/// The spec's conditions of a Gateway's status, its listeners' and addresses.
fn gateway_status(
    gw: &Gateway,
    checked: &[CheckedListener<'_>],
    address: Option<IpAddr>,
    attached: &BTreeMap<String, usize>,
) -> Value {
    let generation = gw.metadata.generation;
    let valid = checked.iter().filter(|c| c.ok).count();
    let accepted = if checked.is_empty() || valid == checked.len() {
        cond("Accepted", true, "Accepted", "Gateway is accepted")
    } else if valid > 0 {
        cond("Accepted", true, "ListenersNotValid", "some listeners are not valid")
    } else {
        cond("Accepted", false, "ListenersNotValid", "no listener is valid")
    };
    let programmed = match (address, valid) {
        (None, _) => {
            cond("Programmed", false, "AddressNotAssigned", "waiting for an address from the load-balancer pool")
        }
        (Some(_), 0) => cond("Programmed", false, "Invalid", "no listener can be served"),
        (Some(ip), _) => cond("Programmed", true, "Programmed", format!("served by the lab's gateway on {ip}")),
    };
    let listeners: Vec<Value> = checked
        .iter()
        .map(|c| {
            let mut conds = c.conds.clone();
            conds.push(if c.ok && address.is_some() {
                cond("Programmed", true, "Programmed", "Listener is programmed")
            } else if c.ok {
                cond("Programmed", false, "Pending", "waiting for the Gateway's address")
            } else {
                cond("Programmed", false, "Invalid", "Listener is not valid")
            });
            json!({
                "name": c.l.name,
                "supportedKinds": c.kinds.iter().map(|k| json!({"group": k.group, "kind": k.kind})).collect::<Vec<_>>(),
                "attachedRoutes": attached.get(&c.l.name).copied().unwrap_or(0),
                "conditions": conds_json(&conds, generation),
            })
        })
        .collect();
    let addresses: Vec<Value> =
        address.map(|a| json!({"type": "IPAddress", "value": a.to_string()})).into_iter().collect();
    json!({
        "addresses": addresses,
        "conditions": conds_json(&[accepted, programmed], generation),
        "listeners": listeners,
    })
}

/// Conditions as JSON, without transition times ([`merge_conditions`] adds them).
pub fn conds_json(conds: &[Cond], generation: i64) -> Vec<Value> {
    conds
        .iter()
        .map(|c| {
            json!({"type": c.type_, "status": if c.status { "True" } else { "False" }, "reason": c.reason,
                   "message": c.message, "observedGeneration": generation})
        })
        .collect()
}

/// Gives each condition of `new` its `lastTransitionTime`: the old one when the old list had the
/// same type with the same status, `now` otherwise. Recurses into `listeners` and `parents`.
pub fn merge_conditions(old: &Value, new: &mut Value, now: &str) {
    let old_conds = old.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(conds) = new.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conds {
            let since = old_conds
                .iter()
                .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                .and_then(|o| o["lastTransitionTime"].as_str())
                .filter(|t| !t.starts_with("1970"))
                .unwrap_or(now)
                .to_string();
            c["lastTransitionTime"] = json!(since);
        }
    }
    for (list, key) in [("listeners", "name"), ("parents", "parentRef")] {
        let olds = old.get(list).and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(items) = new.get_mut(list).and_then(Value::as_array_mut) {
            for item in items {
                let prev = olds.iter().find(|o| o[key] == item[key]).cloned().unwrap_or(Value::Null);
                merge_conditions(&prev, item, now);
            }
        }
    }
}

/// The Service that gives a Gateway its address.
fn gateway_service(gw: &Gateway) -> core::Service {
    let mut ports: Vec<i32> = gw.spec.listeners.iter().map(|l| l.port).filter(|p| (1..=65535).contains(p)).collect();
    ports.sort();
    ports.dedup();
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"name": format!("port-{p}"), "port": p, "protocol": "TCP", "targetPort": p}))
        .collect();
    let ports = if ports.is_empty() { vec![json!({"name": "port-80", "port": 80, "protocol": "TCP"})] } else { ports };
    // Decoded by `api`'s one copy of a Service's deserializer (`Codec`), not one of our own.
    core::Service::from_json(json!({
        "metadata": {
            "name": service_name(&gw.metadata.name),
            "namespace": gw.metadata.namespace,
            "labels": {GATEWAY_LABEL: gw.metadata.name, MANAGED_BY: MANAGER},
            "ownerReferences": [{"apiVersion": format!("{GROUP}/v1"), "kind": "Gateway", "name": gw.metadata.name,
                                 "uid": gw.metadata.uid, "controller": true}],
        },
        "spec": {"type": "LoadBalancer", "ports": ports},
    }))
    .unwrap_or_default()
}

/// The plan.
pub fn plan(inputs: &Inputs) -> Plan {
    let ctx = Ctx { inputs, services: inputs.services.iter().map(|s| (svc_key(s), s)).collect() };
    let mut out = Plan::default();
    let ours: BTreeSet<&str> = inputs
        .classes
        .iter()
        .filter(|c| c.spec.controller_name == CONTROLLER)
        .map(|c| c.metadata.name.as_str())
        .collect();
    for c in inputs.classes.iter().filter(|c| ours.contains(c.metadata.name.as_str())) {
        out.classes.push((
            c.metadata.name.clone(),
            vec![cond("Accepted", true, "Accepted", "Handled by the podpath lab's gateway (lb-sim)")],
            c.metadata.generation,
        ));
    }
    let gateways: Vec<&Gateway> = inputs
        .gateways
        .iter()
        .filter(|g| ours.contains(g.spec.gateway_class_name.as_str()) && g.metadata.deletion_timestamp.is_none())
        .collect();
    let checked: BTreeMap<String, Vec<CheckedListener<'_>>> =
        gateways.iter().map(|g| (g.metadata.key(), check_listeners(&ctx, g))).collect();
    // Routes: every parent that is a Gateway of ours.
    let mut routes: Vec<AnyRoute<'_>> = Vec::new();
    for r in &inputs.http_routes {
        routes.push(AnyRoute {
            kind: RouteKind::Http,
            meta: &r.metadata,
            parents: &r.spec.parent_refs,
            hostnames: &r.spec.hostnames,
            rules: r
                .spec
                .rules
                .iter()
                .map(|x| {
                    (x.name.clone(), http_matches(x), x.filters.clone(), x.backend_refs.as_slice(), x.timeouts.clone())
                })
                .collect(),
        });
    }
    for r in &inputs.grpc_routes {
        routes.push(AnyRoute {
            kind: RouteKind::Grpc,
            meta: &r.metadata,
            parents: &r.spec.parent_refs,
            hostnames: &r.spec.hostnames,
            rules: r
                .spec
                .rules
                .iter()
                .map(|x| (x.name.clone(), grpc_matches(x), x.filters.clone(), x.backend_refs.as_slice(), None))
                .collect(),
        });
    }
    // (gateway key, listener) → rules.
    let mut attached_rules: BTreeMap<(String, String), Vec<Rule>> = BTreeMap::new();
    let mut attached_count: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for route in &routes {
        if route.meta.deletion_timestamp.is_some() {
            continue;
        }
        let mut parents_status = Vec::new();
        for p in route.parents {
            if p.group.as_deref().unwrap_or(GROUP) != GROUP || p.kind.as_deref().unwrap_or("Gateway") != "Gateway" {
                continue;
            }
            let gns = p.namespace.clone().unwrap_or_else(|| route.meta.namespace.clone());
            let gkey = key_of(&gns, &p.name);
            let Some(gw) = gateways.iter().find(|g| g.metadata.key() == gkey) else { continue };
            let (accepted, listeners) = attach(&ctx, route, p, gw, &checked[&gkey]);
            let mut resolved = cond("ResolvedRefs", true, "ResolvedRefs", "All references are resolved");
            let mut compiled = Vec::new();
            for (i, (name, matches, filters, refs, timeouts)) in route.rules.iter().enumerate() {
                let (bs, mut problem) = backends(&ctx, route, refs);
                let (rule_mirrors, mirror_problem) = mirrors(&ctx, route, filters);
                problem = problem.or(mirror_problem);
                if let Some((reason, message)) = problem {
                    if resolved.status {
                        resolved = cond("ResolvedRefs", false, reason, message);
                    }
                }
                compiled.push(Rule {
                    kind: route.kind,
                    route: route.meta.key(),
                    created: route.meta.creation_timestamp.clone(),
                    index: i,
                    name: name.clone(),
                    hostnames: vec![],
                    matches: matches.clone(),
                    filters: filters.clone(),
                    backends: bs,
                    mirrors: rule_mirrors,
                    timeouts: timeouts.clone(),
                });
            }
            if accepted.status {
                for (listener, hosts) in &listeners {
                    *attached_count.entry(gkey.clone()).or_default().entry(listener.clone()).or_default() += 1;
                    for r in &compiled {
                        let mut r = r.clone();
                        r.hostnames = hosts.clone();
                        attached_rules.entry((gkey.clone(), listener.clone())).or_default().push(r);
                    }
                }
            }
            let mut shown = p.clone();
            shown.group.get_or_insert_with(|| GROUP.to_string());
            shown.kind.get_or_insert_with(|| "Gateway".to_string());
            parents_status.push((shown, vec![accepted, resolved]));
        }
        if !parents_status.is_empty() {
            let resource = match route.kind {
                RouteKind::Http => HTTP_ROUTES,
                RouteKind::Grpc => GRPC_ROUTES,
            };
            out.routes.push((resource, route.meta.key(), parents_status, route.meta.generation));
        }
    }
    // Gateways: their Service, address, status and sites.
    for gw in gateways {
        let key = gw.metadata.key();
        out.services.push(gateway_service(gw));
        let svc = ctx.services.get(&key_of(&gw.metadata.namespace, &service_name(&gw.metadata.name)));
        let address = svc
            .and_then(|s| s.status.as_ref())
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.ip.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        let counts = attached_count.remove(&key).unwrap_or_default();
        let listeners = &checked[&key];
        out.gateways.push((key.clone(), gateway_status(gw, listeners, address, &counts)));
        let Some(vip) = address else { continue };
        let mut ports: BTreeMap<u16, Site> = BTreeMap::new();
        for c in listeners.iter().filter(|c| c.ok) {
            let port = c.l.port as u16;
            let site = ports.entry(port).or_insert_with(|| Site {
                gateway: key.clone(),
                vip,
                port,
                https: c.l.protocol == "HTTPS",
                certs: vec![],
                listeners: vec![],
            });
            site.certs.extend(c.certs.iter().cloned());
            site.listeners.push(ListenerSite {
                name: c.l.name.clone(),
                hostname: c.l.hostname.clone(),
                https: c.l.protocol == "HTTPS",
                rules: attached_rules.remove(&(key.clone(), c.l.name.clone())).unwrap_or_default(),
            });
        }
        out.sites.extend(ports.into_values());
    }
    out
}

/// Whether a route's status has entries of this controller.
pub fn has_our_parents(status: &Value) -> bool {
    status["parents"].as_array().is_some_and(|ps| ps.iter().any(|p| p["controllerName"] == CONTROLLER))
}

/// A route's status: this controller's parents replaced, other controllers' kept.
pub fn route_status(old: &Value, parents: &[(ParentRef, Vec<Cond>)], generation: i64) -> Value {
    let mut kept: Vec<Value> = old["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["controllerName"] != CONTROLLER)
        .collect();
    for (p, conds) in parents {
        kept.push(json!({"parentRef": p, "controllerName": CONTROLLER, "conditions": conds_json(conds, generation)}));
    }
    json!({"parents": kept})
}
