//! Routing one request through a Gateway's site, as the Gateway API orders it (pure): the
//! listener by the most specific hostname, then among the rules of the routes attached to it
//! whose hostnames match the request, the match with an Exact path, then a regular expression
//! (the longest), then the longest prefix, then a method, then the most header matches, then the most query matches; ties go to the
//! oldest route, then to `namespace/name` order, then to the rule's order. Then the filters:
//! what a redirect answers, how the request is rewritten, which headers change; and the
//! backend by weight.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use super::plan::{Backend, ListenerSite, Match, NamedMatch, PathRule, Rule, Site, ValueRule};
use super::types::{HeaderModifier, HttpRouteFilter, PathModifier};

/// A request's headers as matching reads them: the first value of a name, compared without
/// case. The proxy's `HeaderMap` as it came (nothing copied), or a list in tests.
pub trait Headers: Sync {
    fn first(&self, name: &str) -> Option<&str>;
}

impl Headers for HeaderMap {
    fn first(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Headers for Vec<(String, String)> {
    fn first(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A request as routing sees it.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    /// The Host header (or :authority), without a port.
    pub host: &'a str,
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query string (without `?`).
    pub query: &'a str,
    pub headers: &'a dyn Headers,
}

/// What matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched<'a> {
    pub listener: &'a ListenerSite,
    pub rule: &'a Rule,
    pub matched: &'a Match,
    /// Where they are in the site: (listener, rule, match) indices.
    pub at: (usize, usize, usize),
}

/// The listener that takes a host: an exact hostname before the longest wildcard, before none.
pub fn listener<'a>(site: &'a Site, host: &str) -> Option<&'a ListenerSite> {
    site.listeners
        .iter()
        .filter(|l| l.hostname.as_deref().is_none_or(|h| super::plan::host_matches(h, host)))
        .max_by_key(|l| match l.hostname.as_deref() {
            None => (0, 0),
            Some(h) if h.starts_with("*.") => (1, h.len()),
            Some(h) => (2, h.len()),
        })
}

fn path_matches(rule: &PathRule, path: &str) -> bool {
    match rule {
        PathRule::Exact(p) => p == path,
        PathRule::Prefix(p) => {
            let p = p.trim_end_matches('/');
            p.is_empty() || path == p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))
        }
        PathRule::Regex(re) => re.is_match(path),
    }
}

fn value_matches(m: &NamedMatch, value: Option<&str>) -> bool {
    let Some(v) = value else { return false };
    match &m.value {
        ValueRule::Regex(re) => re.is_match(v),
        ValueRule::Exact(x) => v == x,
    }
}

fn query_pairs(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

fn matches(m: &Match, req: &Request<'_>, query: &[(String, String)]) -> bool {
    let header = |name: &str| req.headers.first(name);
    let param = |name: &str| query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    path_matches(&m.path, req.path)
        && m.method.as_deref().is_none_or(|meth| meth.eq_ignore_ascii_case(req.method))
        && m.headers.iter().all(|h| value_matches(h, header(&h.name)))
        && m.query.iter().all(|q| value_matches(q, param(&q.name)))
}

/// Whether a rule's hostnames take the request's host (none: the listener's alone decide).
fn rule_takes(rule: &Rule, host: &str) -> Option<(u8, usize)> {
    if rule.hostnames.is_empty() {
        return Some((0, 0));
    }
    rule.hostnames
        .iter()
        .filter(|h| super::plan::host_matches(h, host))
        .map(|h| if h.starts_with("*.") { (1, h.len()) } else { (2, h.len()) })
        .max()
}

/// The rule and match a request goes to.
pub fn route<'a>(site: &'a Site, req: &Request<'_>) -> Option<Matched<'a>> {
    let l = listener(site, req.host)?;
    let query = query_pairs(req.query);
    // The precedence key: bigger wins, except the created time and names (smaller wins).
    type Key<'b> = (
        (u8, usize),
        u8,
        usize,
        bool,
        usize,
        usize,
        std::cmp::Reverse<&'b str>,
        std::cmp::Reverse<&'b str>,
        std::cmp::Reverse<usize>,
    );
    let mut best: Option<(Key<'a>, &'a Rule, &'a Match, (usize, usize))> = None;
    for (ri, rule) in l.rules.iter().enumerate() {
        let Some(host_rank) = rule_takes(rule, req.host) else { continue };
        for (mi, m) in rule.matches.iter().enumerate().filter(|(_, m)| matches(m, req, &query)) {
            // Exact, then regular expressions (their precedence is implementation-specific: by
            // length, after Exact and before any prefix, as Envoy Gateway orders them), then
            // the longest prefix.
            let (class, len) = match &m.path {
                PathRule::Exact(p) => (2, p.len()),
                PathRule::Regex(r) => (1, r.source.len()),
                PathRule::Prefix(p) => (0, p.trim_end_matches('/').len()),
            };
            let key: Key<'a> = (
                host_rank,
                class,
                len,
                m.method.is_some(),
                m.headers.len(),
                m.query.len(),
                std::cmp::Reverse(rule.created.as_str()),
                std::cmp::Reverse(rule.route.as_str()),
                std::cmp::Reverse(rule.index),
            );
            if best.as_ref().is_none_or(|(k, ..)| key > *k) {
                best = Some((key, rule, m, (ri, mi)));
            }
        }
    }
    let li = site.listeners.iter().position(|x| std::ptr::eq(x, l)).unwrap_or(0);
    best.map(|(_, rule, matched, (ri, mi))| Matched { listener: l, rule, matched, at: (li, ri, mi) })
}

/// The backend for a roll in `[0, total weight)`: each backend takes a share of rolls as big
/// as its weight. None when every weight is 0.
pub fn pick(backends: &[Backend], roll: u32) -> Option<&Backend> {
    let total: u32 = backends.iter().map(|b| b.weight).sum();
    if total == 0 {
        return None;
    }
    let mut r = roll % total;
    for b in backends {
        if r < b.weight {
            return Some(b);
        }
        r -= b.weight;
    }
    None
}

pub fn total_weight(backends: &[Backend]) -> u32 {
    backends.iter().map(|b| b.weight).sum()
}

/// What the filters of a rule (then its backend's) do to a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    /// A redirect answered at once: (status, Location).
    pub redirect: Option<(u16, String)>,
    /// The path (and query) sent to the backend.
    pub path: Option<String>,
    pub host: Option<String>,
    pub request_headers: Vec<HeaderModifier>,
    pub response_headers: Vec<HeaderModifier>,
    /// Backends (`namespace/name`, port) that get a copy.
    pub mirrors: Vec<(String, i32)>,
}

/// The filters among `filters` that act, in words for traces (`URLRewrite`, `RequestMirror to
/// app/shadow:80`): as [`effects`] applies them, a redirect ending the list.
pub fn applied(filters: &[HttpRouteFilter], route_ns: &str) -> Vec<String> {
    let mut out = Vec::new();
    for f in filters {
        let acts = match f.type_.as_str() {
            "RequestHeaderModifier" => f.request_header_modifier.is_some(),
            "ResponseHeaderModifier" => f.response_header_modifier.is_some(),
            "RequestRedirect" => f.request_redirect.is_some(),
            "URLRewrite" => f.url_rewrite.is_some(),
            "RequestMirror" => {
                if let Some(m) = &f.request_mirror {
                    let ns = m.backend_ref.namespace.as_deref().unwrap_or(route_ns);
                    let port = m.backend_ref.port.unwrap_or(0);
                    out.push(format!("{} to {ns}/{}:{port}", f.type_, m.backend_ref.name));
                }
                false
            }
            _ => false,
        };
        if acts {
            out.push(f.type_.clone());
        }
        if acts && f.type_ == "RequestRedirect" {
            break;
        }
    }
    out
}

fn rewrite_path(m: &PathModifier, matched: &PathRule, path: &str) -> String {
    match m.type_.as_str() {
        "ReplaceFullPath" => m.replace_full_path.clone().unwrap_or_else(|| "/".into()),
        _ => {
            let prefix = match matched {
                PathRule::Prefix(p) | PathRule::Exact(p) => p.trim_end_matches('/').to_string(),
                PathRule::Regex(_) => String::new(),
            };
            let rest = path.strip_prefix(prefix.as_str()).unwrap_or(path);
            let with = m.replace_prefix_match.clone().unwrap_or_else(|| "/".into());
            let with = with.trim_end_matches('/');
            let joined = match (with.is_empty(), rest.is_empty()) {
                (true, true) => "/".to_string(),
                (true, false) => rest.to_string(),
                (false, _) => format!("{with}{rest}"),
            };
            if joined.starts_with('/') {
                joined
            } else {
                format!("/{joined}")
            }
        }
    }
}

/// The effects of `filters` on a request that matched `matched` (`https`: the listener's
/// scheme; `port`: the listener's port).
pub fn effects(
    filters: &[HttpRouteFilter],
    matched: &PathRule,
    req: &Request<'_>,
    https: bool,
    port: u16,
    route_ns: &str,
) -> Effects {
    let mut e = Effects::default();
    for f in filters {
        match f.type_.as_str() {
            "RequestHeaderModifier" => {
                if let Some(m) = &f.request_header_modifier {
                    e.request_headers.push(m.clone());
                }
            }
            "ResponseHeaderModifier" => {
                if let Some(m) = &f.response_header_modifier {
                    e.response_headers.push(m.clone());
                }
            }
            "RequestRedirect" => {
                let Some(r) = &f.request_redirect else { continue };
                let scheme = r.scheme.clone().unwrap_or_else(|| if https { "https".into() } else { "http".into() });
                let host = r.hostname.clone().unwrap_or_else(|| req.host.to_string());
                // The port: the filter's, else the scheme's default when the scheme changed,
                // else the listener's; a scheme's default port is not written.
                let port = match (r.port, r.scheme.is_some()) {
                    (Some(p), _) => p as u16,
                    (None, true) => {
                        if scheme == "https" {
                            443
                        } else {
                            80
                        }
                    }
                    (None, false) => port,
                };
                let default_port = (scheme == "https" && port == 443) || (scheme == "http" && port == 80);
                let path = match &r.path {
                    Some(m) => rewrite_path(m, matched, req.path),
                    None => req.path.to_string(),
                };
                let query = if req.query.is_empty() { String::new() } else { format!("?{}", req.query) };
                let authority = if default_port { host } else { format!("{host}:{port}") };
                let code = r.status_code.unwrap_or(302) as u16;
                e.redirect = Some((code, format!("{scheme}://{authority}{path}{query}")));
                return e;
            }
            "URLRewrite" => {
                let Some(r) = &f.url_rewrite else { continue };
                if let Some(h) = &r.hostname {
                    e.host = Some(h.clone());
                }
                if let Some(m) = &r.path {
                    let p = rewrite_path(m, matched, req.path);
                    e.path = Some(if req.query.is_empty() { p } else { format!("{p}?{}", req.query) });
                }
            }
            "RequestMirror" => {
                if let Some(m) = &f.request_mirror {
                    let ns = m.backend_ref.namespace.clone().unwrap_or_else(|| route_ns.to_string());
                    e.mirrors.push((format!("{ns}/{}", m.backend_ref.name), m.backend_ref.port.unwrap_or(0)));
                }
            }
            _ => {}
        }
    }
    e
}

/// Headers after the modifiers: `set` replaces, `add` appends to the first value (`a,b`),
/// `remove` drops; a name or value that is not valid HTTP is skipped.
pub fn modify_headers(headers: &mut HeaderMap, mods: &[HeaderModifier]) {
    let named = |n: &str| HeaderName::from_bytes(n.as_bytes()).ok();
    for m in mods {
        for nv in &m.set {
            if let (Some(name), Ok(value)) = (named(&nv.name), HeaderValue::from_str(&nv.value)) {
                headers.insert(name, value);
            }
        }
        for nv in &m.add {
            let Some(name) = named(&nv.name) else { continue };
            let joined = match headers.get(&name).map(|v| v.as_bytes()) {
                Some(old) => [old, b",", nv.value.as_bytes()].concat(),
                None => nv.value.as_bytes().to_vec(),
            };
            if let Ok(value) = HeaderValue::from_bytes(&joined) {
                headers.insert(name, value);
            }
        }
        for name in &m.remove {
            if let Some(name) = named(name) {
                headers.remove(name);
            }
        }
    }
}

/// A match in words: `PathPrefix /api, method POST, header version=two, query beta=1`.
pub fn describe_match(m: &Match) -> String {
    let mut parts = vec![match &m.path {
        PathRule::Exact(p) => format!("Exact {p}"),
        PathRule::Prefix(p) => format!("PathPrefix {p}"),
        PathRule::Regex(p) => format!("RegularExpression {}", p.source),
    }];
    if let Some(meth) = &m.method {
        parts.push(format!("method {meth}"));
    }
    let value = |v: &ValueRule| match v {
        ValueRule::Exact(x) => format!("={x}"),
        ValueRule::Regex(p) => format!("~{}", p.source),
    };
    for h in &m.headers {
        parts.push(format!("header {}{}", h.name, value(&h.value)));
    }
    for q in &m.query {
        parts.push(format!("query {}{}", q.name, value(&q.value)));
    }
    parts.join(", ")
}

/// A backend in words: `default/web:80 (weight 90: 10.244.1.5:8080, 10.244.2.5:8080)`.
pub fn describe_backend(b: &Backend) -> String {
    let detail = match &b.problem {
        Some(p) => p.clone(),
        None if b.endpoints.is_empty() => "no ready endpoint".into(),
        None => b.endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", "),
    };
    format!("{}:{} (weight {}: {detail})", b.service, b.port, b.weight)
}

/// Every rule of a listener in words, in no particular order of precedence.
pub fn describe_listener(l: &ListenerSite) -> Vec<String> {
    let host = l.hostname.clone().unwrap_or_else(|| "*".into());
    l.rules
        .iter()
        .map(|r| {
            let hosts = if r.hostnames.is_empty() { String::new() } else { format!(" [{}]", r.hostnames.join(", ")) };
            let matches: Vec<String> = r.matches.iter().map(describe_match).collect();
            let filters: Vec<&str> = r.filters.iter().map(|f| f.type_.as_str()).collect();
            let filters = if filters.is_empty() { String::new() } else { format!(" filters {}", filters.join(", ")) };
            let backends: Vec<String> = r.backends.iter().map(describe_backend).collect();
            let to = if backends.is_empty() { "no backend".to_string() } else { backends.join(", ") };
            format!(
                "listener {} ({host}): {} {}{hosts} rule {}: {}{filters} → {to}",
                l.name,
                r.kind.as_str(),
                r.route,
                r.index,
                matches.join(" | ")
            )
        })
        .collect()
}
