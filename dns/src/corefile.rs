//! The Corefile, as CoreDNS reads it: server blocks (`.:53 { … }`), each a list of plugin
//! directives with arguments and an optional block of properties. Pure: text in, a checked
//! [`Corefile`] out, or the error CoreDNS prints (`Corefile:5 - Error during parsing: Unknown
//! directive 'bogus'`). Only the plugins a lab's cluster DNS needs are built in; the other
//! CoreDNS plugins are named in their refusal so a user knows the directive is real but not here.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::rr::Name;

/// The plugins podpath-dns runs, in CoreDNS's execution order (plugin.cfg): whatever the order
/// in the Corefile, a query meets them in this order.
pub const PLUGINS: &[&str] = &[
    "reload",
    "ready",
    "health",
    "prometheus",
    "errors",
    "log",
    "loadbalance",
    "cache",
    "kubernetes",
    "loop",
    "forward",
];

/// CoreDNS plugins that exist but are not built into podpath-dns.
const ELSEWHERE: &[&str] = &[
    "metadata",
    "geoip",
    "cancel",
    "tls",
    "timeouts",
    "multisocket",
    "nsid",
    "bufsize",
    "bind",
    "debug",
    "trace",
    "pprof",
    "dnstap",
    "local",
    "dns64",
    "acl",
    "any",
    "chaos",
    "tsig",
    "rewrite",
    "header",
    "dnssec",
    "autopath",
    "minimal",
    "template",
    "transfer",
    "hosts",
    "route53",
    "azure",
    "clouddns",
    "k8s_external",
    "file",
    "auto",
    "secondary",
    "etcd",
    "grpc",
    "erratic",
    "whoami",
    "on",
    "sign",
    "view",
];

/// A parse or setup error, worded as CoreDNS words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorefileError(pub String);

impl std::fmt::Display for CorefileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CorefileError {}

fn parsing(file: &str, line: usize, msg: impl std::fmt::Display) -> CorefileError {
    CorefileError(format!("{file}:{line} - Error during parsing: {msg}"))
}

/// A whole Corefile.
#[derive(Debug, Clone, PartialEq)]
pub struct Corefile {
    pub servers: Vec<ServerBlock>,
}

/// One server block: the zones it serves on a port, and its plugins.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerBlock {
    /// Fully qualified, lower case; `.` for the root.
    pub zones: Vec<Name>,
    /// None: the server's port (`--listen`).
    pub port: Option<u16>,
    pub plugins: Plugins,
}

/// One server block's plugins (None or false: not in the block).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plugins {
    pub errors: bool,
    pub log: Option<Log>,
    /// `health [ADDR]` (`:8080`), with its lameduck.
    pub health: Option<(SocketAddr, Duration)>,
    pub ready: Option<SocketAddr>,
    pub prometheus: Option<SocketAddr>,
    pub kubernetes: Option<Kubernetes>,
    pub forward: Option<Forward>,
    pub cache: Option<Cache>,
    pub loop_detect: bool,
    /// `reload [INTERVAL [JITTER]]`.
    pub reload: Option<(Duration, Duration)>,
    pub loadbalance: bool,
}

/// Which responses `log` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Log {
    /// Only names under these (empty: every name).
    pub names: Vec<Name>,
    /// `class success|denial|error|all` (empty: all).
    pub classes: Vec<String>,
}

/// `pods disabled|insecure|verified`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pods {
    Disabled,
    Insecure,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Kubernetes {
    /// The zones it is authoritative for (the block's when none are given).
    pub zones: Vec<Name>,
    pub pods: Pods,
    pub ttl: u32,
    /// `fallthrough [ZONES]`: NXDOMAIN for names under these goes to the next plugin (an empty
    /// list: every zone).
    pub fallthrough: Option<Vec<Name>>,
}

impl Kubernetes {
    /// The cluster domain: its one zone that is not a reverse zone.
    pub fn domain(&self) -> Option<&Name> {
        self.zones.iter().find(|z| !is_reverse(z))
    }
}

/// Where `forward` sends a query.
#[derive(Debug, Clone, PartialEq)]
pub enum Upstream {
    Addr(SocketAddr),
    /// A resolv.conf whose nameservers are the upstreams (read when the Corefile is loaded).
    ResolvConf(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Random,
    RoundRobin,
    Sequential,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    pub from: Name,
    pub to: Vec<Upstream>,
    pub except: Vec<Name>,
    pub force_tcp: bool,
    pub prefer_udp: bool,
    pub policy: Policy,
    /// Consecutive failures before an upstream counts as down (0: never).
    pub max_fails: u32,
    /// 0: no limit.
    pub max_concurrent: usize,
}

/// `cache [TTL] [ZONES]` with its `success`/`denial` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Cache {
    pub zones: Vec<Name>,
    pub success: CacheKind,
    pub denial: CacheKind,
    pub keepttl: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CacheKind {
    pub capacity: usize,
    pub max_ttl: u32,
    pub min_ttl: u32,
    /// `disable success|denial [ZONES]`: not cached under these zones.
    pub disabled: Option<Vec<Name>>,
}

/// Whether `z` is a reverse zone.
pub fn is_reverse(z: &Name) -> bool {
    let s = z.to_ascii().to_ascii_lowercase();
    s.ends_with("in-addr.arpa.") || s.ends_with("ip6.arpa.")
}

/// Whether `name` is at or under one of `zones`.
pub fn under(name: &Name, zones: &[Name]) -> bool {
    zones.iter().any(|z| z.zone_of(name))
}

/// The zone of `zones` that holds `name` most specifically.
pub fn longest<'a>(name: &Name, zones: &'a [Name]) -> Option<&'a Name> {
    zones.iter().filter(|z| z.zone_of(name)).max_by_key(|z| z.num_labels())
}

// ---- lexing ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
    /// Quoted: never a brace.
    quoted: bool,
}

impl Token {
    fn is(&self, s: &str) -> bool {
        !self.quoted && self.text == s
    }
}

/// Splits a Corefile into tokens: words, quoted strings (`\"` escapes), `#` comments to the
/// end of the line; each token keeps its line.
fn lex(text: &str, file: &str) -> Result<Vec<Token>, CorefileError> {
    let mut out = vec![];
    let mut line = 1;
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            '\n' => {
                line += 1;
                chars.next();
            }
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => {
                while chars.peek().is_some_and(|c| *c != '\n') {
                    chars.next();
                }
            }
            '"' => {
                chars.next();
                let start = line;
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err(parsing(file, start, "Unterminated quoted string")),
                        Some('\\') if chars.peek() == Some(&'"') => s.push(chars.next().unwrap_or('"')),
                        Some('"') => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            s.push(c)
                        }
                    }
                }
                out.push(Token { text: s, line: start, quoted: true });
            }
            _ => {
                let mut s = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '"' {
                        break;
                    }
                    s.push(c);
                    chars.next();
                }
                out.push(Token { text: s, line, quoted: false });
            }
        }
    }
    Ok(out)
}

// ---- parsing --------------------------------------------------------------------------

/// One directive as written: its name, the arguments on its line, and the lines of its block.
#[derive(Debug, Clone)]
struct Directive {
    name: String,
    line: usize,
    args: Vec<String>,
    /// (property, its arguments, line)
    block: Vec<(String, Vec<String>, usize)>,
}

/// Parses and checks a Corefile; `file` names it in errors (`Corefile`).
pub fn parse(text: &str, file: &str) -> Result<Corefile, CorefileError> {
    let tokens = lex(text, file)?;
    let mut servers = vec![];
    let mut i = 0;
    while i < tokens.len() {
        // The keys: every token up to `{` (one Corefile block may go without braces).
        let first_line = tokens[i].line;
        let mut keys = vec![];
        while i < tokens.len() && !tokens[i].is("{") {
            if tokens[i].is("}") {
                return Err(parsing(file, tokens[i].line, "Unexpected '}' because no matching opening brace"));
            }
            if tokens[i].line != first_line {
                break;
            }
            keys.extend(tokens[i].text.split(',').filter(|s| !s.is_empty()).map(str::to_string));
            i += 1;
        }
        let braced = i < tokens.len() && tokens[i].is("{");
        if braced {
            i += 1;
        } else if !servers.is_empty() {
            return Err(parsing(file, first_line, "Unexpected next token, expected '{'"));
        }
        let mut directives: Vec<Directive> = vec![];
        loop {
            let Some(t) = tokens.get(i) else {
                if braced {
                    return Err(parsing(file, tokens.last().map_or(1, |t| t.line), "Unexpected EOF"));
                }
                break;
            };
            if t.is("}") {
                if !braced {
                    return Err(parsing(file, t.line, "Unexpected '}' because no matching opening brace"));
                }
                i += 1;
                break;
            }
            if t.is("{") {
                return Err(parsing(file, t.line, "Unexpected '{'"));
            }
            let (name, line) = (t.text.clone(), t.line);
            i += 1;
            let mut args = vec![];
            while i < tokens.len() && tokens[i].line == line && !tokens[i].is("{") && !tokens[i].is("}") {
                args.push(tokens[i].text.clone());
                i += 1;
            }
            let mut block = vec![];
            if i < tokens.len() && tokens[i].line == line && tokens[i].is("{") {
                i += 1;
                loop {
                    let Some(t) = tokens.get(i) else {
                        return Err(parsing(file, line, "Unexpected EOF"));
                    };
                    if t.is("}") {
                        i += 1;
                        break;
                    }
                    if t.is("{") {
                        return Err(parsing(file, t.line, "Unexpected '{'"));
                    }
                    let (prop, pline) = (t.text.clone(), t.line);
                    i += 1;
                    let mut pargs = vec![];
                    while i < tokens.len() && tokens[i].line == pline && !tokens[i].is("{") && !tokens[i].is("}") {
                        pargs.push(tokens[i].text.clone());
                        i += 1;
                    }
                    block.push((prop, pargs, pline));
                }
            }
            directives.push(Directive { name, line, args, block });
        }
        servers.push(server_block(&keys, first_line, directives, file)?);
    }
    if servers.is_empty() {
        return Err(CorefileError(format!("{file}: no server block: a Corefile needs one, such as `.:53 {{ … }}`")));
    }
    // Two blocks may not serve the same zone on the same port.
    let mut seen: Vec<(Name, Option<u16>)> = vec![];
    for s in &servers {
        for z in &s.zones {
            if seen.contains(&(z.clone(), s.port)) {
                return Err(CorefileError(format!(
                    "cannot serve dns://{}:{} - zone already defined for dns://{}:{}",
                    z,
                    s.port.unwrap_or(53),
                    z,
                    s.port.unwrap_or(53)
                )));
            }
            seen.push((z.clone(), s.port));
        }
    }
    Ok(Corefile { servers })
}

fn zone_name(s: &str) -> Result<Name, String> {
    let mut n = Name::from_ascii(s).map_err(|e| format!("{s:?} is not a domain name: {e}"))?;
    n.set_fqdn(true);
    Ok(n.to_lowercase())
}

/// A server block key: `[dns://]ZONE[:PORT]`.
fn key(k: &str) -> Result<(Name, Option<u16>), String> {
    let k = k.strip_prefix("dns://").unwrap_or(k);
    if k.contains("://") {
        return Err(format!("{k:?}: only plain DNS (dns://) is served by podpath-dns"));
    }
    let (zone, port) = match k.rsplit_once(':') {
        Some((z, p)) => (z, Some(p.parse::<u16>().map_err(|_| format!("invalid port {p:?} in {k:?}"))?)),
        None => (k, None),
    };
    let zone = if zone.is_empty() { "." } else { zone };
    Ok((zone_name(zone)?, port))
}

fn server_block(
    keys: &[String],
    line: usize,
    directives: Vec<Directive>,
    file: &str,
) -> Result<ServerBlock, CorefileError> {
    if keys.is_empty() {
        return Err(parsing(file, line, "a server block needs a zone, such as `.:53`"));
    }
    let mut zones = vec![];
    let mut port = None;
    for k in keys {
        let (z, p) = key(k).map_err(|e| parsing(file, line, e))?;
        if p.is_some() && port.is_some() && p != port {
            return Err(parsing(file, line, format!("the keys of one server block name two ports: {keys:?}")));
        }
        port = port.or(p);
        zones.push(z);
    }
    let mut plugins = Plugins::default();
    let mut used: Vec<&str> = vec![];
    for d in &directives {
        let name = d.name.as_str();
        let Some(known) = PLUGINS.iter().find(|p| **p == name) else {
            if ELSEWHERE.contains(&name) {
                return Err(parsing(
                    file,
                    d.line,
                    format!(
                        "plugin/{name} is a CoreDNS plugin that podpath-dns does not have (it has: {})",
                        PLUGINS.join(", ")
                    ),
                ));
            }
            return Err(parsing(file, d.line, format!("Unknown directive '{name}'")));
        };
        if used.contains(known) {
            return Err(parsing(
                file,
                d.line,
                format!("plugin/{name}: this plugin can only be used once per Server Block"),
            ));
        }
        used.push(known);
        setup(&mut plugins, d, &zones).map_err(|e| {
            // CoreDNS prefixes a plugin's own complaints with the plugin.
            if e.starts_with("Wrong argument count") || e.starts_with("unknown property") {
                parsing(file, d.line, e)
            } else {
                parsing(file, d.line, format!("plugin/{name}: {e}"))
            }
        })?;
    }
    Ok(ServerBlock { zones, port, plugins })
}

fn wrong_args(d: &Directive) -> String {
    format!("Wrong argument count or unexpected line ending after '{}'", d.name)
}

fn no_block(d: &Directive) -> Result<(), String> {
    match d.block.first() {
        Some((p, _, _)) => Err(format!("unknown property '{p}'")),
        None => Ok(()),
    }
}

fn listen(arg: Option<&String>, default: u16) -> Result<SocketAddr, String> {
    let Some(a) = arg else { return Ok(SocketAddr::from(([0, 0, 0, 0], default))) };
    // `:8080` means every address.
    let full = if a.starts_with(':') { format!("0.0.0.0{a}") } else { a.clone() };
    full.parse().map_err(|_| format!("{a:?} is not an address such as :{default} or 127.0.0.1:{default}"))
}

/// A duration as Go writes it: `30s`, `2m`, `1m30s`, `500ms`.
pub fn duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("time: invalid duration {s:?}");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total += Duration::from_secs_f64(n * unit);
    }
    Ok(total)
}

fn zones_or(args: &[String], default: &[Name]) -> Result<Vec<Name>, String> {
    if args.is_empty() {
        return Ok(default.to_vec());
    }
    args.iter().map(|a| zone_name(a)).collect()
}

fn number<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{what} {s:?} is not a number"))
}

fn setup(p: &mut Plugins, d: &Directive, block_zones: &[Name]) -> Result<(), String> {
    let a = &d.args;
    match d.name.as_str() {
        "errors" => {
            if !a.is_empty() {
                return Err(wrong_args(d));
            }
            no_block(d)?;
            p.errors = true;
        }
        "log" => {
            let mut classes = vec![];
            for (prop, args, _) in &d.block {
                if prop != "class" || args.is_empty() {
                    return Err(format!("unknown property '{prop}'"));
                }
                for c in args {
                    if !["success", "denial", "error", "all"].contains(&c.as_str()) {
                        return Err(format!("invalid class {c:?}: success, denial, error or all"));
                    }
                    classes.push(c.clone());
                }
            }
            if classes.iter().any(|c| c == "all") {
                classes.clear();
            }
            p.log = Some(Log { names: a.iter().map(|n| zone_name(n)).collect::<Result<_, _>>()?, classes });
        }
        "health" => {
            if a.len() > 1 {
                return Err(wrong_args(d));
            }
            let mut lameduck = Duration::ZERO;
            for (prop, args, _) in &d.block {
                match (prop.as_str(), args.as_slice()) {
                    ("lameduck", [v]) => lameduck = duration(v)?,
                    _ => return Err(format!("unknown property '{prop}'")),
                }
            }
            p.health = Some((listen(a.first(), 8080)?, lameduck));
        }
        "ready" => {
            if a.len() > 1 {
                return Err(wrong_args(d));
            }
            no_block(d)?;
            p.ready = Some(listen(a.first(), 8181)?);
        }
        "prometheus" => {
            if a.len() > 1 {
                return Err(wrong_args(d));
            }
            no_block(d)?;
            p.prometheus = Some(listen(a.first(), 9153)?);
        }
        "loop" => {
            if !a.is_empty() {
                return Err(wrong_args(d));
            }
            no_block(d)?;
            p.loop_detect = true;
        }
        "loadbalance" => {
            if a.len() > 1 || a.first().is_some_and(|x| x != "round_robin") {
                return Err(format!("unknown policy: {}", a.first().cloned().unwrap_or_default()));
            }
            no_block(d)?;
            p.loadbalance = true;
        }
        "reload" => {
            if a.len() > 2 {
                return Err(wrong_args(d));
            }
            no_block(d)?;
            let interval = a.first().map(|s| duration(s)).transpose()?.unwrap_or(Duration::from_secs(30));
            let jitter = a.get(1).map(|s| duration(s)).transpose()?.unwrap_or(Duration::from_secs(15));
            if interval < Duration::from_secs(2) {
                return Err(format!("interval value must be greater or equal to 2s: {interval:?}"));
            }
            if jitter < Duration::from_secs(1) {
                return Err(format!("jitter value must be greater or equal to 1s: {jitter:?}"));
            }
            // As CoreDNS: a jitter over half the interval is cut to half.
            p.reload = Some((interval, jitter.min(interval / 2)));
        }
        "kubernetes" => {
            let zones = zones_or(a, block_zones)?;
            let mut k = Kubernetes { zones, pods: Pods::Disabled, ttl: 5, fallthrough: None };
            for (prop, args, _) in &d.block {
                match prop.as_str() {
                    "pods" => {
                        k.pods = match args.as_slice() {
                            [m] if m == "disabled" => Pods::Disabled,
                            [m] if m == "insecure" => Pods::Insecure,
                            [m] if m == "verified" => {
                                return Err("pods verified is not built into podpath-dns (it watches no pods): \
                                            use insecure or disabled"
                                    .into())
                            }
                            _ => return Err(format!("invalid pods mode: {}", args.join(" "))),
                        }
                    }
                    "ttl" => {
                        let [v] = args.as_slice() else {
                            return Err(format!("ttl needs one value: {}", args.join(" ")));
                        };
                        let t: u32 = number(v, "ttl")?;
                        if t > 3600 {
                            return Err(format!("ttl must be in range [0, 3600]: {t}"));
                        }
                        k.ttl = t;
                    }
                    "fallthrough" => k.fallthrough = Some(args.iter().map(|z| zone_name(z)).collect::<Result<_, _>>()?),
                    "endpoint_pod_names" | "namespaces" | "labels" | "namespace_labels" | "noendpoints"
                    | "endpoint" | "tls" | "kubeconfig" | "apiserver" | "multicluster" | "ignore" => {
                        return Err(format!("the property '{prop}' is not built into podpath-dns"))
                    }
                    _ => return Err(format!("unknown property '{prop}'")),
                }
            }
            if k.zones.iter().filter(|z| !is_reverse(z)).count() != 1 {
                return Err(format!(
                    "podpath-dns serves one cluster domain (and reverse zones); the zones are {}",
                    k.zones.iter().map(|z| z.to_string()).collect::<Vec<_>>().join(" ")
                ));
            }
            p.kubernetes = Some(k);
        }
        "forward" => {
            if a.len() < 2 {
                return Err(wrong_args(d));
            }
            let from = zone_name(&a[0])?;
            let mut to = vec![];
            for t in &a[1..] {
                to.push(upstream(t)?);
            }
            if to.len() > 15 {
                return Err(format!("more than 15 TOs configured: {}", to.len()));
            }
            let mut f = Forward {
                from,
                to,
                except: vec![],
                force_tcp: false,
                prefer_udp: false,
                policy: Policy::Random,
                max_fails: 2,
                max_concurrent: 0,
            };
            for (prop, args, _) in &d.block {
                match (prop.as_str(), args.as_slice()) {
                    ("except", zs) if !zs.is_empty() => {
                        f.except = zs.iter().map(|z| zone_name(z)).collect::<Result<_, _>>()?;
                    }
                    ("force_tcp", []) => f.force_tcp = true,
                    ("prefer_udp", []) => f.prefer_udp = true,
                    ("policy", [v]) => {
                        f.policy = match v.as_str() {
                            "random" => Policy::Random,
                            "round_robin" => Policy::RoundRobin,
                            "sequential" => Policy::Sequential,
                            _ => return Err(format!("unknown policy '{v}'")),
                        }
                    }
                    ("max_fails", [v]) => f.max_fails = number(v, "max_fails")?,
                    ("max_concurrent", [v]) => f.max_concurrent = number(v, "max_concurrent")?,
                    ("tls" | "tls_servername" | "health_check" | "expire" | "next" | "failover", _) => {
                        return Err(format!("the property '{prop}' is not built into podpath-dns"))
                    }
                    _ => return Err(format!("unknown property '{prop}'")),
                }
            }
            if f.force_tcp && f.prefer_udp {
                return Err("'force_tcp' and 'prefer_udp' are mutually exclusive".into());
            }
            p.forward = Some(f);
        }
        "cache" => {
            let mut args = a.as_slice();
            let mut max_ttl = 3600;
            if let Some(first) = args.first() {
                if let Ok(t) = first.parse::<u32>() {
                    if t == 0 {
                        return Err(format!("cache TTL can not be zero or negative: {t}"));
                    }
                    max_ttl = t;
                    args = &args[1..];
                }
            }
            let kind = |max_ttl, min_ttl| CacheKind { capacity: 9984, max_ttl, min_ttl, disabled: None };
            let mut c = Cache {
                zones: zones_or(args, block_zones)?,
                success: kind(max_ttl, 5),
                denial: kind(max_ttl.min(1800), 5),
                keepttl: false,
            };
            for (prop, args, _) in &d.block {
                match prop.as_str() {
                    "success" | "denial" => {
                        let k = if prop == "success" { &mut c.success } else { &mut c.denial };
                        let [cap, rest @ ..] = args.as_slice() else {
                            return Err(wrong_args(d));
                        };
                        k.capacity = number(cap, "capacity")?;
                        if let Some(t) = rest.first() {
                            k.max_ttl = number(t, "TTL")?;
                        }
                        if let Some(t) = rest.get(1) {
                            k.min_ttl = number(t, "minimum TTL")?;
                        }
                        if rest.len() > 2 {
                            return Err(wrong_args(d));
                        }
                    }
                    "disable" => {
                        let [which, zs @ ..] = args.as_slice() else { return Err(wrong_args(d)) };
                        let zs = zs.iter().map(|z| zone_name(z)).collect::<Result<Vec<_>, _>>()?;
                        match which.as_str() {
                            "success" => c.success.disabled = Some(zs),
                            "denial" => c.denial.disabled = Some(zs),
                            _ => {
                                return Err(format!(
                                    "cache type for disable must be \"success\" or \"denial\": {which}"
                                ))
                            }
                        }
                    }
                    "keepttl" => c.keepttl = true,
                    "prefetch" | "serve_stale" | "servfail" => {
                        return Err(format!("the property '{prop}' is not built into podpath-dns"))
                    }
                    _ => return Err(format!("unknown property '{prop}'")),
                }
            }
            p.cache = Some(c);
        }
        other => return Err(format!("Unknown directive '{other}'")),
    }
    Ok(())
}

fn upstream(t: &str) -> Result<Upstream, String> {
    let s = t.strip_prefix("dns://").unwrap_or(t);
    if s.contains("://") {
        return Err(format!("only dns:// upstreams are built into podpath-dns: {t:?}"));
    }
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(Upstream::Addr(SocketAddr::new(ip, 53)));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Upstream::Addr(a));
    }
    if s.starts_with('/') || s.starts_with('.') {
        return Ok(Upstream::ResolvConf(s.to_string()));
    }
    Err(format!("not an IP address or file: {t:?}"))
}

/// The nameservers of a resolv.conf text, as upstreams on port 53.
pub fn resolv_nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some("nameserver")).then(|| f.next()).flatten()
        })
        .filter_map(|ip| ip.split('%').next()?.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// The Corefile podpath-dns runs without one: the cluster zone and its reverse zones, answers
/// for other names refused (no upstream).
pub fn builtin(
    port: Option<u16>,
    domain: &str,
    ttl: u32,
    health: Option<SocketAddr>,
    ready: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
) -> String {
    let p = port.map(|p| format!(":{p}")).unwrap_or_default();
    let mut s = format!("{domain}{p} in-addr.arpa{p} ip6.arpa{p} {{\n    errors\n");
    if let Some(a) = health {
        s += &format!("    health {a}\n");
    }
    if let Some(a) = ready {
        s += &format!("    ready {a}\n");
    }
    s += &format!(
        "    kubernetes {domain} in-addr.arpa ip6.arpa {{\n        pods insecure\n        ttl {ttl}\n    }}\n"
    );
    if let Some(a) = metrics {
        s += &format!("    prometheus {a}\n");
    }
    s += "}\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubeadm's Corefile with the lab's cache exceptions (cluster names are not cached).
    const LAB: &str = r#".:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
"#;

    fn n(s: &str) -> Name {
        zone_name(s).unwrap()
    }

    #[test]
    fn kubeadms_corefile_parses_into_its_plugins() {
        let c = parse(LAB, "Corefile").unwrap();
        assert_eq!(c.servers.len(), 1);
        let s = &c.servers[0];
        assert_eq!((s.zones.clone(), s.port), (vec![Name::root()], Some(53)));
        let p = &s.plugins;
        assert!(p.errors && p.loop_detect && p.loadbalance);
        assert_eq!(p.health, Some(("0.0.0.0:8080".parse().unwrap(), Duration::from_secs(5))));
        assert_eq!(p.ready, Some("0.0.0.0:8181".parse().unwrap()));
        assert_eq!(p.prometheus, Some("0.0.0.0:9153".parse().unwrap()));
        let k = p.kubernetes.as_ref().unwrap();
        assert_eq!(k.zones, vec![n("cluster.local"), n("in-addr.arpa"), n("ip6.arpa")]);
        assert_eq!((k.pods, k.ttl), (Pods::Insecure, 30));
        assert_eq!(k.fallthrough, Some(vec![n("in-addr.arpa"), n("ip6.arpa")]));
        assert_eq!(k.domain(), Some(&n("cluster.local")));
        let f = p.forward.as_ref().unwrap();
        assert_eq!(f.from, Name::root());
        assert_eq!(f.to, vec![Upstream::ResolvConf("/etc/resolv.conf".into())]);
        assert_eq!((f.max_concurrent, f.policy), (1000, Policy::Random));
        let cache = p.cache.as_ref().unwrap();
        assert_eq!((cache.success.max_ttl, cache.denial.max_ttl), (30, 30));
        assert_eq!(cache.success.disabled, Some(vec![n("cluster.local")]));
        assert_eq!(cache.zones, vec![Name::root()]);
        assert_eq!(p.reload, Some((Duration::from_secs(30), Duration::from_secs(15))));
        assert!(p.log.is_none());
    }

    #[test]
    fn errors_name_the_line_as_coredns_does() {
        let bad = LAB.replace("    loop\n", "    loop\n    bogus\n");
        assert_eq!(
            parse(&bad, "Corefile").unwrap_err().0,
            "Corefile:21 - Error during parsing: Unknown directive 'bogus'"
        );
        let hosts = LAB.replace("    loop\n", "    hosts\n");
        let e = parse(&hosts, "Corefile").unwrap_err().0;
        assert!(
            e.starts_with(
                "Corefile:20 - Error during parsing: plugin/hosts is a CoreDNS plugin that podpath-dns does not have"
            ),
            "{e}"
        );
        let e = parse(".:53 {\n    health a b\n}\n", "Corefile").unwrap_err().0;
        assert_eq!(
            e,
            "Corefile:2 - Error during parsing: Wrong argument count or unexpected line ending after 'health'"
        );
        let e = parse(".:53 {\n  kubernetes cluster.local {\n    podz insecure\n  }\n}\n", "Corefile").unwrap_err().0;
        assert_eq!(e, "Corefile:2 - Error during parsing: unknown property 'podz'");
        let e = parse(".:53 {\n  forward . foo\n}\n", "Corefile").unwrap_err().0;
        assert_eq!(e, "Corefile:2 - Error during parsing: plugin/forward: not an IP address or file: \"foo\"");
        assert_eq!(
            parse(".:53 {\n  errors\n", "Corefile").unwrap_err().0,
            "Corefile:2 - Error during parsing: Unexpected EOF"
        );
        let e = parse(".:53 {\n  errors\n}\n}\n", "Corefile").unwrap_err().0;
        assert_eq!(e, "Corefile:4 - Error during parsing: Unexpected '}' because no matching opening brace");
        let e = parse(".:53 {\n  log\n  log\n}\n", "Corefile").unwrap_err().0;
        assert!(e.contains("plugin/log: this plugin can only be used once per Server Block"), "{e}");
        let e = parse(".:53 {\n  reload 1s\n}\n", "Corefile").unwrap_err().0;
        assert!(e.contains("plugin/reload: interval value must be greater or equal to 2s"), "{e}");
        let e = parse(".:53 {\n  kubernetes cluster.local {\n    pods verified\n  }\n}\n", "Corefile").unwrap_err().0;
        assert!(e.contains("pods verified is not built into podpath-dns"), "{e}");
        assert!(parse("", "Corefile").unwrap_err().0.contains("no server block"));
        let e = parse(".:53 {\n errors\n}\n.:53 {\n errors\n}\n", "Corefile").unwrap_err().0;
        assert_eq!(e, "cannot serve dns://.:53 - zone already defined for dns://.:53");
    }

    #[test]
    fn stub_domains_blocks_and_quoting() {
        let c = parse(
            "# a stub domain, as \"Customizing DNS Service\" adds one\nconsul.local:53 {\n    errors\n    cache 30\n    forward . 10.150.0.1 \"10.150.0.2:5353\" {\n        policy sequential\n        except a.consul.local\n    }\n}\n\n.:53 {\n    log . {\n        class denial error\n    }\n    kubernetes cluster.local\n    forward . 8.8.8.8\n    reload 10s\n}\n",
            "Corefile",
        )
        .unwrap();
        assert_eq!(c.servers.len(), 2);
        let stub = &c.servers[0];
        assert_eq!(stub.zones, vec![n("consul.local")]);
        let f = stub.plugins.forward.as_ref().unwrap();
        assert_eq!(
            f.to,
            vec![Upstream::Addr("10.150.0.1:53".parse().unwrap()), Upstream::Addr("10.150.0.2:5353".parse().unwrap())]
        );
        assert_eq!((f.policy, f.except.clone()), (Policy::Sequential, vec![n("a.consul.local")]));
        assert_eq!(stub.plugins.cache.as_ref().unwrap().zones, vec![n("consul.local")]);
        let root = &c.servers[1].plugins;
        assert_eq!(root.log, Some(Log { names: vec![Name::root()], classes: vec!["denial".into(), "error".into()] }));
        assert_eq!(root.kubernetes.as_ref().unwrap().pods, Pods::Disabled);
        assert_eq!(root.reload, Some((Duration::from_secs(10), Duration::from_secs(5))));
        // One block may go without braces.
        let one = parse("example.org\nerrors\nlog\n", "Corefile").unwrap();
        assert_eq!((one.servers[0].zones.clone(), one.servers[0].port), (vec![n("example.org")], None));
        assert!(one.servers[0].plugins.log.is_some());
    }

    #[test]
    fn go_durations_and_resolv_conf() {
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(duration("5x").is_err() && duration("").is_err() && duration("s").is_err());
        assert_eq!(
            resolv_nameservers("# x\nnameserver 10.0.0.2\nsearch a\nnameserver fe80::1%eth0\nnameserver bad\n"),
            vec!["10.0.0.2:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]
        );
    }

    #[test]
    fn the_builtin_corefile_parses() {
        let text = builtin(Some(53), "cluster.local", 30, Some("0.0.0.0:8080".parse().unwrap()), None, None);
        let c = parse(&text, "Corefile").unwrap();
        let k = c.servers[0].plugins.kubernetes.as_ref().unwrap();
        assert_eq!((k.ttl, k.pods, c.servers[0].port), (30, Pods::Insecure, Some(53)));
        assert!(c.servers[0].plugins.forward.is_none() && c.servers[0].plugins.ready.is_none());
    }
}
