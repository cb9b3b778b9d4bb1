//! The cluster zone as CoreDNS's `kubernetes` plugin serves it (the Kubernetes DNS-based
//! service discovery specification, with kubeadm's Corefile choices: `pods insecure`, TTL 30,
//! reverse zones). Pure: no sockets, no clock.
//!
//! The zone keeps what DNS needs of each Service and EndpointSlice ([`ServiceRecord`],
//! [`SliceRecord`], projections made as objects arrive, as CoreDNS reduces objects to its own
//! small types) in indexes updated one object at a time; a question's records are made when
//! it is asked ([`Zone::answer`]). Nothing is rebuilt when one Service changes, and 10,000
//! Services cost a few megabytes, not the objects' hundreds.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The version of the DNS specification served, as `dns-version.<zone>` says it.
pub const SCHEMA_VERSION: &str = "1.1.0";

/// What a zone is built with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The cluster domain (`cluster.local`).
    pub domain: Name,
    /// TTL of every answer (kubeadm's Corefile: 30).
    pub ttl: u32,
    /// `pods insecure`: `a-b-c-d.<ns>.pod.<zone>` answers its address (`pods disabled`: NXDOMAIN).
    pub pods: bool,
}

impl Config {
    pub fn new(domain: &str, ttl: u32) -> Result<Config, String> {
        let mut d = Name::from_ascii(domain).map_err(|e| format!("invalid cluster domain {domain:?}: {e}"))?;
        d.set_fqdn(true);
        Ok(Config { domain: d.to_lowercase(), ttl, pods: true })
    }
}

/// One answer: the response code and the sections.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub code: ResponseCode,
    pub answers: Vec<Record>,
    /// The zone's SOA for negative answers (NXDOMAIN and NODATA), so resolvers cache them.
    pub authority: Vec<Record>,
    /// Addresses of SRV targets.
    pub additional: Vec<Record>,
}

impl Answer {
    pub fn refused() -> Answer {
        Answer { code: ResponseCode::Refused, answers: vec![], authority: vec![], additional: vec![] }
    }
}

/// A named port of a Service or EndpointSlice, as its SRV owner spells it: name and protocol
/// in lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub proto: String,
    pub port: u16,
}

fn named_port(name: Option<&str>, proto: Option<&str>, port: Option<i32>) -> Option<NamedPort> {
    let name = name.filter(|n| !n.is_empty())?.to_ascii_lowercase();
    let port = u16::try_from(port?).ok()?;
    Some(NamedPort { name, proto: proto.unwrap_or("TCP").to_ascii_lowercase(), port })
}

/// What DNS needs of a Service.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceRecord {
    /// Nothing to serve (no spec, or no cluster IP yet).
    Nothing,
    /// A/AAAA of the cluster IPs, SRV of the named ports pointing at the Service's name.
    ClusterIp { ips: Vec<IpAddr>, ports: Vec<NamedPort> },
    /// Records of the ready endpoints (all endpoints with `publishNotReadyAddresses`).
    Headless { publish_not_ready: bool },
    /// A CNAME to this name.
    External(Name),
}

impl ServiceRecord {
    pub fn of(svc: &Service) -> ServiceRecord {
        let Some(spec) = svc.spec.as_ref() else { return ServiceRecord::Nothing };
        if spec.type_.as_deref() == Some("ExternalName") {
            return match spec.external_name.as_deref().and_then(name) {
                Some(target) => ServiceRecord::External(target),
                None => ServiceRecord::Nothing,
            };
        }
        if spec.cluster_ip.as_deref() == Some("None") {
            return ServiceRecord::Headless { publish_not_ready: spec.publish_not_ready_addresses == Some(true) };
        }
        let mut ips: Vec<IpAddr> = vec![];
        for ip in spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter()).filter_map(|ip| ip.parse().ok()) {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        if ips.is_empty() {
            return ServiceRecord::Nothing;
        }
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), Some(p.port)))
            .collect();
        ServiceRecord::ClusterIp { ips, ports }
    }

    fn cluster_ips(&self) -> &[IpAddr] {
        match self {
            ServiceRecord::ClusterIp { ips, .. } => ips,
            _ => &[],
        }
    }
}

/// What DNS needs of one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub ips: Vec<IpAddr>,
    pub hostname: Option<String>,
    pub ready: bool,
}

impl Endpoint {
    /// Its label under the Service: the hostname, else the dashed address (CoreDNS's choice).
    fn label(&self, ip: IpAddr) -> String {
        match self.hostname.as_deref().filter(|h| !h.is_empty()) {
            Some(h) => h.to_ascii_lowercase(),
            None => dashed(ip),
        }
    }
}

/// What DNS needs of an EndpointSlice.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceRecord {
    /// `namespace/name` of its Service (the `kubernetes.io/service-name` label).
    pub service: Option<String>,
    pub ports: Vec<NamedPort>,
    pub endpoints: Vec<Endpoint>,
}

impl SliceRecord {
    pub fn of(s: &EndpointSlice) -> SliceRecord {
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        let service = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .map(|svc| format!("{ns}/{svc}"));
        let ports = s
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), p.port))
            .collect();
        let endpoints = s
            .endpoints
            .iter()
            .map(|e| Endpoint {
                ips: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                hostname: e.hostname.clone(),
                // An endpoint without conditions is ready (the API's documented default).
                ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
            })
            .collect();
        SliceRecord { service, ports, endpoints }
    }
}

fn name(s: &str) -> Option<Name> {
    let mut n = Name::from_ascii(s).ok()?;
    n.set_fqdn(true);
    Some(n.to_lowercase())
}

/// The reverse-lookup name of an address (`5.1.244.10.in-addr.arpa.`).
pub fn reverse_name(ip: IpAddr) -> Name {
    let text = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let hex: String = v6.octets().iter().map(|b| format!("{b:02x}")).collect();
            let mut nibbles: Vec<String> = hex.chars().rev().map(|c| c.to_string()).collect();
            nibbles.push("ip6.arpa.".into());
            nibbles.join(".")
        }
    };
    Name::from_ascii(text).expect("a reverse name is valid")
}

/// The address a reverse-lookup name stands for, if it is a whole one.
pub fn reverse_ip(q: &Name) -> Option<IpAddr> {
    let labels: Vec<String> = q.iter().map(|l| String::from_utf8_lossy(l).to_ascii_lowercase()).collect();
    let n = labels.len();
    if n == 6 && labels[4] == "in-addr" && labels[5] == "arpa" {
        let mut o = [0u8; 4];
        for (i, l) in labels[..4].iter().enumerate() {
            // Decimal octets as written, no leading zeros (`010` is not 10 here).
            if l.len() > 1 && l.starts_with('0') {
                return None;
            }
            o[3 - i] = l.parse().ok()?;
        }
        return Some(IpAddr::from(o));
    }
    if n == 34 && labels[32] == "ip6" && labels[33] == "arpa" {
        let mut o = [0u8; 16];
        for (i, l) in labels[..32].iter().enumerate() {
            if l.len() != 1 {
                return None;
            }
            let nibble = u8::from_str_radix(l, 16).ok()?;
            let pos = 31 - i;
            o[pos / 2] |= if pos % 2 == 0 { nibble << 4 } else { nibble };
        }
        return Some(IpAddr::from(o));
    }
    None
}

/// An address as one DNS label, as CoreDNS names endpoints without a hostname (`10-244-1-5`).
pub fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

fn address(owner: &Name, ttl: u32, ip: IpAddr) -> Record {
    let data = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(owner.clone(), ttl, data)
}

fn matches_type(ip: IpAddr, qtype: RecordType) -> bool {
    matches!((ip, qtype), (_, RecordType::ANY) | (IpAddr::V4(_), RecordType::A) | (IpAddr::V6(_), RecordType::AAAA))
}

/// Who owns an address's PTR record.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    /// A ClusterIP Service (`namespace/name`).
    Service(String),
    /// An endpoint of this EndpointSlice (`namespace/name`), named under a headless Service.
    Slice(String),
}

/// The cluster zone: what DNS needs of every Service and EndpointSlice, indexed for answers.
#[derive(Debug, Clone)]
pub struct Zone {
    cfg: Config,
    serial: u32,
    /// By `namespace/name`.
    services: HashMap<String, ServiceRecord>,
    /// By the slice's `namespace/name`.
    slices: HashMap<String, SliceRecord>,
    /// Service `namespace/name` → its slices' keys.
    by_service: HashMap<String, BTreeSet<String>>,
    /// Services per namespace (`<ns>.svc.<zone>` exists while one does).
    namespaces: HashMap<String, usize>,
    /// Address → who may own its PTR record (checked again when asked).
    reverse: HashMap<IpAddr, BTreeSet<Owner>>,
}

/// The labels of `q` below the zone's apex, leftmost first, in lower case.
fn relative(q: &Name, domain: &Name) -> Vec<String> {
    let n = q.num_labels().saturating_sub(domain.num_labels()) as usize;
    q.iter().take(n).map(|l| String::from_utf8_lossy(l).to_ascii_lowercase()).collect()
}

impl Zone {
    pub fn new(cfg: Config) -> Zone {
        Zone {
            cfg,
            serial: 1,
            services: HashMap::new(),
            slices: HashMap::new(),
            by_service: HashMap::new(),
            namespaces: HashMap::new(),
            reverse: HashMap::new(),
        }
    }

    /// The zone for these Services and their EndpointSlices (matched by the
    /// `kubernetes.io/service-name` label), with SOA serial `serial`.
    pub fn build(cfg: Config, services: &[Service], slices: &[EndpointSlice], serial: u32) -> Zone {
        let mut z = Zone::new(cfg);
        for s in services {
            z.set_service(key(&s.metadata), ServiceRecord::of(s));
        }
        for s in slices {
            z.set_slice(key(&s.metadata), SliceRecord::of(s));
        }
        z.serial = serial;
        z
    }

    /// New settings (a reloaded Corefile): answers are made with them from now on.
    pub fn set_config(&mut self, cfg: Config) {
        self.cfg = cfg;
        self.changed();
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A negative answer of the zone (with its SOA).
    pub fn negative_answer(&self, code: ResponseCode) -> Answer {
        self.negative(code)
    }

    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// The number of Services and EndpointSlices held.
    pub fn len(&self) -> (usize, usize) {
        (self.services.len(), self.slices.len())
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.slices.is_empty()
    }

    fn changed(&mut self) {
        self.serial = self.serial.wrapping_add(1).max(1);
    }

    fn index(&mut self, ips: impl IntoIterator<Item = IpAddr>, owner: &Owner, add: bool) {
        for ip in ips {
            if add {
                self.reverse.entry(ip).or_default().insert(owner.clone());
            } else if let Some(set) = self.reverse.get_mut(&ip) {
                set.remove(owner);
                if set.is_empty() {
                    self.reverse.remove(&ip);
                }
            }
        }
    }

    /// Adds or replaces the Service `namespace/name`.
    pub fn set_service(&mut self, key: String, rec: ServiceRecord) {
        self.delete_service_quietly(&key);
        let owner = Owner::Service(key.clone());
        self.index(rec.cluster_ips().to_vec(), &owner, true);
        let ns = key.split_once('/').map(|(ns, _)| ns.to_string()).unwrap_or_default();
        *self.namespaces.entry(ns).or_default() += 1;
        self.services.insert(key, rec);
        self.changed();
    }

    pub fn delete_service(&mut self, key: &str) {
        if self.delete_service_quietly(key) {
            self.changed();
        }
    }

    fn delete_service_quietly(&mut self, key: &str) -> bool {
        let Some(old) = self.services.remove(key) else { return false };
        self.index(old.cluster_ips().to_vec(), &Owner::Service(key.to_string()), false);
        let ns = key.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
        if let Some(n) = self.namespaces.get_mut(ns) {
            *n -= 1;
            if *n == 0 {
                self.namespaces.remove(ns);
            }
        }
        true
    }

    /// Replaces every Service (a relist).
    pub fn replace_services(&mut self, all: impl IntoIterator<Item = (String, ServiceRecord)>) {
        let keys: Vec<String> = self.services.keys().cloned().collect();
        for k in keys {
            self.delete_service_quietly(&k);
        }
        for (k, r) in all {
            self.set_service(k, r);
        }
        self.changed();
    }

    /// Adds or replaces the EndpointSlice `namespace/name`.
    pub fn set_slice(&mut self, key: String, rec: SliceRecord) {
        self.delete_slice_quietly(&key);
        let owner = Owner::Slice(key.clone());
        let ips: Vec<IpAddr> = rec.endpoints.iter().flat_map(|e| e.ips.iter().copied()).collect();
        self.index(ips, &owner, true);
        if let Some(svc) = &rec.service {
            self.by_service.entry(svc.clone()).or_default().insert(key.clone());
        }
        self.slices.insert(key, rec);
        self.changed();
    }

    pub fn delete_slice(&mut self, key: &str) {
        if self.delete_slice_quietly(key) {
            self.changed();
        }
    }

    fn delete_slice_quietly(&mut self, key: &str) -> bool {
        let Some(old) = self.slices.remove(key) else { return false };
        let ips: Vec<IpAddr> = old.endpoints.iter().flat_map(|e| e.ips.iter().copied()).collect();
        self.index(ips, &Owner::Slice(key.to_string()), false);
        if let Some(svc) = &old.service {
            if let Some(set) = self.by_service.get_mut(svc) {
                set.remove(key);
                if set.is_empty() {
                    self.by_service.remove(svc);
                }
            }
        }
        true
    }

    /// Replaces every EndpointSlice (a relist).
    pub fn replace_slices(&mut self, all: impl IntoIterator<Item = (String, SliceRecord)>) {
        let keys: Vec<String> = self.slices.keys().cloned().collect();
        for k in keys {
            self.delete_slice_quietly(&k);
        }
        for (k, r) in all {
            self.set_slice(k, r);
        }
        self.changed();
    }

    fn soa(&self) -> Record {
        let d = &self.cfg.domain;
        let soa = SOA::new(
            name(&format!("ns.dns.{d}")).expect("valid"),
            name(&format!("hostmaster.{d}")).expect("valid"),
            self.serial,
            7200,
            1800,
            86400,
            self.cfg.ttl,
        );
        Record::from_rdata(d.clone(), self.cfg.ttl, RData::SOA(soa))
    }

    /// `<svc>.<ns>.svc.<zone>`.
    fn base(&self, key: &str) -> Option<Name> {
        let (ns, svc) = key.split_once('/')?;
        name(&format!("{svc}.{ns}.svc.{}", self.cfg.domain))
    }

    /// The endpoints a headless Service publishes, each address once, in slice order:
    /// (address, its label under the Service).
    fn published(&self, key: &str, publish_not_ready: bool) -> Vec<(IpAddr, String)> {
        let mut out: Vec<(IpAddr, String)> = vec![];
        for slice in self.by_service.get(key).into_iter().flatten().filter_map(|k| self.slices.get(k)) {
            for e in slice.endpoints.iter().filter(|e| e.ready || publish_not_ready) {
                for ip in &e.ips {
                    if !out.iter().any(|(o, _)| o == ip) {
                        out.push((*ip, e.label(*ip)));
                    }
                }
            }
        }
        out
    }

    /// The named ports of a headless Service's slices, each once.
    fn slice_ports(&self, key: &str) -> Vec<NamedPort> {
        let mut out: Vec<NamedPort> = vec![];
        for slice in self.by_service.get(key).into_iter().flatten().filter_map(|k| self.slices.get(k)) {
            for p in &slice.ports {
                if !out.contains(p) {
                    out.push(p.clone());
                }
            }
        }
        out
    }

    /// The answer to `qname` `qtype`: the zone's records; NODATA (no error, no records, the
    /// SOA) for a name that exists without records of that type; NXDOMAIN (with the SOA) for
    /// a name of the zone that does not exist; REFUSED for names that are not the cluster's
    /// (the lab has no upstream to forward them to).
    pub fn answer(&self, qname: &Name, qtype: RecordType) -> Answer {
        let mut q = qname.to_lowercase();
        q.set_fqdn(true);
        if !self.cfg.domain.zone_of(&q) {
            // Reverse names of the cluster's addresses are answered; other reverse names, as
            // every other name, would go upstream.
            return match reverse_ip(&q).map(|ip| self.ptr(&q, ip, qtype)) {
                Some(Some(a)) => a,
                _ => Answer::refused(),
            };
        }
        let rel = relative(&q, &self.cfg.domain);
        let rel: Vec<&str> = rel.iter().map(String::as_str).collect();
        match rel.as_slice() {
            [] => match qtype {
                RecordType::SOA | RecordType::ANY => self.with(vec![self.soa()], vec![]),
                _ => self.negative(ResponseCode::NoError),
            },
            ["dns-version"] => match qtype {
                RecordType::TXT | RecordType::ANY => {
                    let txt = TXT::new(vec![SCHEMA_VERSION.into()]);
                    self.with(vec![Record::from_rdata(q.clone(), self.cfg.ttl, RData::TXT(txt))], vec![])
                }
                _ => self.negative(ResponseCode::NoError),
            },
            ["svc"] => self.exists(!self.services.is_empty()),
            [ns, "svc"] => self.exists(self.namespaces.contains_key(*ns)),
            [svc, ns, "svc"] => self.service(&q, &format!("{ns}/{svc}"), qtype),
            [proto, svc, ns, "svc"] if proto.starts_with('_') => {
                // `_tcp.<svc>`: exists while one of the Service's SRV names is under it.
                let key = format!("{ns}/{svc}");
                let any = self.srv_ports(&key).iter().any(|p| format!("_{}", p.proto) == *proto);
                self.exists(any && self.srv(&q, &key, None, qtype).is_some())
            }
            [label, svc, ns, "svc"] => self.endpoint(&q, &format!("{ns}/{svc}"), label, qtype),
            [port, proto, svc, ns, "svc"] if port.starts_with('_') && proto.starts_with('_') => {
                let key = format!("{ns}/{svc}");
                match self.srv(&q, &key, Some((&port[1..], &proto[1..])), qtype) {
                    Some(a) => a,
                    None => self.negative(ResponseCode::NXDomain),
                }
            }
            [ip, _ns, "pod"] if self.cfg.pods => self.pod(&q, ip, qtype),
            _ => self.negative(ResponseCode::NXDomain),
        }
    }

    /// NODATA if the name exists, else NXDOMAIN.
    fn exists(&self, yes: bool) -> Answer {
        self.negative(if yes { ResponseCode::NoError } else { ResponseCode::NXDomain })
    }

    fn service(&self, q: &Name, key: &str, qtype: RecordType) -> Answer {
        let ttl = self.cfg.ttl;
        match self.services.get(key) {
            None | Some(ServiceRecord::Nothing) => self.negative(ResponseCode::NXDomain),
            // A name with a CNAME has nothing else: the CNAME answers every type (the target
            // is outside the cluster, and there is no upstream to follow it).
            Some(ServiceRecord::External(target)) => {
                self.with(vec![Record::from_rdata(q.clone(), ttl, RData::CNAME(CNAME(target.clone())))], vec![])
            }
            Some(ServiceRecord::ClusterIp { ips, .. }) => {
                let rs: Vec<Record> =
                    ips.iter().filter(|ip| matches_type(**ip, qtype)).map(|ip| address(q, ttl, *ip)).collect();
                self.positive(rs)
            }
            Some(ServiceRecord::Headless { publish_not_ready }) => {
                let eps = self.published(key, *publish_not_ready);
                if eps.is_empty() {
                    // No ready endpoint: the name does not exist.
                    return self.negative(ResponseCode::NXDomain);
                }
                let rs = eps.iter().filter(|(ip, _)| matches_type(*ip, qtype)).map(|(ip, _)| address(q, ttl, *ip));
                self.positive(rs.collect())
            }
        }
    }

    /// `<hostname or dashed address>.<svc>.<ns>.svc.<zone>` of a headless Service.
    fn endpoint(&self, q: &Name, key: &str, label: &str, qtype: RecordType) -> Answer {
        let Some(ServiceRecord::Headless { publish_not_ready }) = self.services.get(key) else {
            return self.negative(ResponseCode::NXDomain);
        };
        let ips: Vec<IpAddr> =
            self.published(key, *publish_not_ready).into_iter().filter(|(_, l)| l == label).map(|(ip, _)| ip).collect();
        if ips.is_empty() {
            return self.negative(ResponseCode::NXDomain);
        }
        let ttl = self.cfg.ttl;
        self.positive(ips.iter().filter(|ip| matches_type(**ip, qtype)).map(|ip| address(q, ttl, *ip)).collect())
    }

    fn srv_ports(&self, key: &str) -> Vec<NamedPort> {
        match self.services.get(key) {
            Some(ServiceRecord::ClusterIp { ports, .. }) => ports.clone(),
            Some(ServiceRecord::Headless { .. }) => self.slice_ports(key),
            _ => vec![],
        }
    }

    /// SRV `_<port>._<proto>.<svc>…` (or, with no port, whether any exists under `_<proto>`):
    /// None when the name does not exist.
    fn srv(&self, q: &Name, key: &str, port: Option<(&str, &str)>, qtype: RecordType) -> Option<Answer> {
        let ttl = self.cfg.ttl;
        let base = self.base(key)?;
        let ports: Vec<NamedPort> = self
            .srv_ports(key)
            .into_iter()
            .filter(|p| port.is_none_or(|(n, proto)| p.name == n && p.proto == proto))
            .collect();
        if ports.is_empty() {
            return None;
        }
        // (target, its addresses)
        let targets: Vec<(Name, Vec<IpAddr>)> = match self.services.get(key)? {
            ServiceRecord::ClusterIp { ips, .. } => vec![(base.clone(), ips.clone())],
            ServiceRecord::Headless { publish_not_ready } => {
                let mut out: Vec<(Name, Vec<IpAddr>)> = vec![];
                for (ip, label) in self.published(key, *publish_not_ready) {
                    let Some(host) = name(&format!("{label}.{base}")) else { continue };
                    match out.iter_mut().find(|(h, _)| *h == host) {
                        Some((_, ips)) => ips.push(ip),
                        None => out.push((host, vec![ip])),
                    }
                }
                out
            }
            _ => vec![],
        };
        if targets.is_empty() {
            return None;
        }
        if port.is_none() {
            return Some(self.negative(ResponseCode::NoError));
        }
        if !matches!(qtype, RecordType::SRV | RecordType::ANY) {
            return Some(self.negative(ResponseCode::NoError));
        }
        // CoreDNS gives every record of a set the same weight, splitting 100 between them.
        let weight = (100 / targets.len()).max(1) as u16;
        let mut answers = vec![];
        let mut additional = vec![];
        for p in &ports {
            for (t, ips) in &targets {
                answers.push(Record::from_rdata(q.clone(), ttl, RData::SRV(SRV::new(0, weight, p.port, t.clone()))));
                for ip in ips {
                    let a = address(t, ttl, *ip);
                    if !additional.contains(&a) {
                        additional.push(a);
                    }
                }
            }
        }
        Some(Answer { code: ResponseCode::NoError, answers, authority: vec![], additional })
    }

    /// `a-b-c-d.<ns>.pod.<zone>` (CoreDNS `pods insecure`: any such name answers its address).
    fn pod(&self, q: &Name, label: &str, qtype: RecordType) -> Answer {
        let Ok(ip) = label.replace('-', ".").parse::<std::net::Ipv4Addr>() else {
            return self.negative(ResponseCode::NXDomain);
        };
        match qtype {
            RecordType::A | RecordType::ANY => self.with(vec![address(q, self.cfg.ttl, IpAddr::V4(ip))], vec![]),
            _ => self.negative(ResponseCode::NoError),
        }
    }

    /// PTR of a cluster IP or a headless Service's endpoint; None when the address is not
    /// the cluster's.
    fn ptr(&self, q: &Name, ip: IpAddr, qtype: RecordType) -> Option<Answer> {
        let mut targets: Vec<Name> = vec![];
        for owner in self.reverse.get(&ip)? {
            match owner {
                Owner::Service(key) => {
                    if let (Some(ServiceRecord::ClusterIp { .. }), Some(base)) =
                        (self.services.get(key), self.base(key))
                    {
                        targets.push(base);
                    }
                }
                Owner::Slice(k) => {
                    let Some(svc) = self.slices.get(k).and_then(|s| s.service.as_deref()) else { continue };
                    let Some(ServiceRecord::Headless { publish_not_ready }) = self.services.get(svc) else { continue };
                    let Some(base) = self.base(svc) else { continue };
                    for (_, label) in self.published(svc, *publish_not_ready).into_iter().filter(|(i, _)| *i == ip) {
                        if let Some(host) = name(&format!("{label}.{base}")) {
                            targets.push(host);
                        }
                    }
                }
            }
        }
        targets.dedup();
        if targets.is_empty() {
            return None;
        }
        if !matches!(qtype, RecordType::PTR | RecordType::ANY) {
            return Some(self.negative(ResponseCode::NoError));
        }
        let ttl = self.cfg.ttl;
        Some(self.with(
            targets.into_iter().map(|t| Record::from_rdata(q.clone(), ttl, RData::PTR(PTR(t)))).collect(),
            vec![],
        ))
    }

    fn with(&self, answers: Vec<Record>, additional: Vec<Record>) -> Answer {
        Answer { code: ResponseCode::NoError, answers, authority: vec![], additional }
    }

    fn negative(&self, code: ResponseCode) -> Answer {
        Answer { code, answers: vec![], authority: vec![self.soa()], additional: vec![] }
    }

    /// Records of a name that exists: them, or NODATA.
    fn positive(&self, rs: Vec<Record>) -> Answer {
        if rs.is_empty() {
            self.negative(ResponseCode::NoError)
        } else {
            self.with(rs, vec![])
        }
    }
}

/// `namespace/name` of an object, as the reflector keys it.
fn key(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", m.namespace.as_deref().unwrap_or("default"), m.name.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    fn zone() -> Zone {
        let services = vec![
            svc(json!({"metadata": {"name": "web", "namespace": "default"},
                       "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}]}})),
            svc(json!({"metadata": {"name": "db", "namespace": "data"},
                       "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}})),
            svc(json!({"metadata": {"name": "empty", "namespace": "data"}, "spec": {"clusterIP": "None"}})),
            svc(json!({"metadata": {"name": "ext", "namespace": "default"},
                       "spec": {"type": "ExternalName", "externalName": "example.org"}})),
        ];
        let slices = vec![slice(json!({
        "metadata": {"name": "db-x", "namespace": "data", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
            {"addresses": ["10.244.2.7"], "conditions": {}},
            {"addresses": ["10.244.2.9"], "conditions": {"ready": false}}
        ]}))];
        Zone::build(Config::new("cluster.local", 30).unwrap(), &services, &slices, 7)
    }

    fn ask(z: &Zone, q: &str, t: RecordType) -> Answer {
        z.answer(&Name::from_ascii(q).unwrap(), t)
    }

    fn texts(rs: &[Record]) -> Vec<String> {
        rs.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn a_cluster_ip_service() {
        let z = zone();
        let a = ask(&z, "web.default.svc.cluster.local.", RecordType::A);
        assert_eq!(a.code, ResponseCode::NoError);
        assert_eq!(texts(&a.answers), ["web.default.svc.cluster.local. 30 IN A 10.96.0.20"]);
        // Case does not matter; the answer keeps the zone's names.
        assert_eq!(ask(&z, "WEB.Default.svc.cluster.local.", RecordType::A).answers, a.answers);
        let srv = ask(&z, "_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(
            texts(&srv.answers),
            ["_http._tcp.web.default.svc.cluster.local. 30 IN SRV 0 100 80 web.default.svc.cluster.local."]
        );
        assert_eq!(texts(&srv.additional), ["web.default.svc.cluster.local. 30 IN A 10.96.0.20"]);
        let ptr = ask(&z, "20.0.96.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(texts(&ptr.answers), ["20.0.96.10.in-addr.arpa. 30 IN PTR web.default.svc.cluster.local."]);
    }

    #[test]
    fn nxdomain_nodata_and_refused_as_the_specification_says() {
        let z = zone();
        // The name exists, without records of that type: NODATA with the SOA.
        let aaaa = ask(&z, "web.default.svc.cluster.local.", RecordType::AAAA);
        assert_eq!((aaaa.code, aaaa.answers.len()), (ResponseCode::NoError, 0));
        assert_eq!(
            texts(&aaaa.authority),
            ["cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 7 7200 1800 86400 30"]
        );
        // Names between the apex and a Service exist too.
        for q in ["default.svc.cluster.local.", "svc.cluster.local."] {
            assert_eq!(ask(&z, q, RecordType::A).code, ResponseCode::NoError, "{q}");
        }
        let nx = ask(&z, "nope.default.svc.cluster.local.", RecordType::A);
        assert_eq!((nx.code, nx.authority.len()), (ResponseCode::NXDomain, 1));
        assert_eq!(ask(&z, "web.other.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
        // Unnamed ports have no SRV records.
        assert_eq!(ask(&z, "_81._tcp.web.default.svc.cluster.local.", RecordType::SRV).code, ResponseCode::NXDomain);
        // Not the cluster's: no upstream in the lab, refused at once.
        assert_eq!(ask(&z, "example.com.", RecordType::A).code, ResponseCode::Refused);
        assert_eq!(ask(&z, "9.9.9.9.in-addr.arpa.", RecordType::PTR).code, ResponseCode::Refused);
        let soa = ask(&z, "cluster.local.", RecordType::SOA);
        assert_eq!(soa.answers.len(), 1);
        let version = ask(&z, "dns-version.cluster.local.", RecordType::TXT);
        assert_eq!(texts(&version.answers), ["dns-version.cluster.local. 30 IN TXT 1.1.0"]);
    }

    #[test]
    fn a_headless_service_answers_its_ready_endpoints() {
        let z = zone();
        let mut a = texts(&ask(&z, "db.data.svc.cluster.local.", RecordType::A).answers);
        a.sort();
        assert_eq!(
            a,
            ["db.data.svc.cluster.local. 30 IN A 10.244.1.5", "db.data.svc.cluster.local. 30 IN A 10.244.2.7"]
        );
        // By hostname, else by dashed address.
        assert_eq!(
            texts(&ask(&z, "db-0.db.data.svc.cluster.local.", RecordType::A).answers),
            ["db-0.db.data.svc.cluster.local. 30 IN A 10.244.1.5"]
        );
        assert_eq!(ask(&z, "10-244-2-7.db.data.svc.cluster.local.", RecordType::A).answers.len(), 1);
        assert_eq!(ask(&z, "10-244-2-9.db.data.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
        let srv = ask(&z, "_pg._tcp.db.data.svc.cluster.local.", RecordType::SRV);
        let mut targets = texts(&srv.answers);
        targets.sort();
        assert_eq!(
            targets,
            [
                "_pg._tcp.db.data.svc.cluster.local. 30 IN SRV 0 50 5432 10-244-2-7.db.data.svc.cluster.local.",
                "_pg._tcp.db.data.svc.cluster.local. 30 IN SRV 0 50 5432 db-0.db.data.svc.cluster.local."
            ]
        );
        assert_eq!(srv.additional.len(), 2);
        assert_eq!(
            texts(&ask(&z, "5.1.244.10.in-addr.arpa.", RecordType::PTR).answers),
            ["5.1.244.10.in-addr.arpa. 30 IN PTR db-0.db.data.svc.cluster.local."]
        );
        // No ready endpoint: the name does not exist.
        assert_eq!(ask(&z, "empty.data.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
    }

    #[test]
    fn external_names_and_pods() {
        let z = zone();
        let c = ask(&z, "ext.default.svc.cluster.local.", RecordType::A);
        assert_eq!(texts(&c.answers), ["ext.default.svc.cluster.local. 30 IN CNAME example.org."]);
        let p = ask(&z, "10-244-1-5.any.pod.cluster.local.", RecordType::A);
        assert_eq!(texts(&p.answers), ["10-244-1-5.any.pod.cluster.local. 30 IN A 10.244.1.5"]);
        assert_eq!(ask(&z, "10-244-1-5.any.pod.cluster.local.", RecordType::AAAA).code, ResponseCode::NoError);
        assert_eq!(ask(&z, "not-an-ip.any.pod.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
    }

    #[test]
    fn reverse_names() {
        assert_eq!(reverse_name("10.244.1.5".parse().unwrap()).to_string(), "5.1.244.10.in-addr.arpa.");
        let v6 = reverse_name("fd00::1".parse().unwrap()).to_string();
        assert!(v6.starts_with("1.0.0.0.0.0.0.0") && v6.ends_with(".0.0.d.f.ip6.arpa."), "{v6}");
    }

    #[test]
    fn reverse_names_parse_back() {
        for ip in ["10.244.1.5", "10.96.0.10", "fd00::1", "2001:db8::a:b"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(reverse_ip(&reverse_name(ip)), Some(ip));
        }
        for bad in ["1.2.3.in-addr.arpa.", "01.2.3.4.in-addr.arpa.", "300.2.3.4.in-addr.arpa.", "a.b.c.d.in-addr.arpa."]
        {
            assert_eq!(reverse_ip(&Name::from_ascii(bad).unwrap()), None, "{bad}");
        }
    }

    #[test]
    fn names_between_a_srv_owner_and_its_service_exist() {
        let z = zone();
        assert_eq!(ask(&z, "_tcp.web.default.svc.cluster.local.", RecordType::A).code, ResponseCode::NoError);
        assert_eq!(ask(&z, "_udp.web.default.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
        assert_eq!(ask(&z, "_tcp.db.data.svc.cluster.local.", RecordType::SRV).code, ResponseCode::NoError);
        // SRV owners answer NODATA for other types.
        let a = ask(&z, "_http._tcp.web.default.svc.cluster.local.", RecordType::A);
        assert_eq!((a.code, a.answers.len()), (ResponseCode::NoError, 0));
    }

    /// Every answer of interest, as text, for comparing zones.
    fn snapshot(z: &Zone) -> Vec<String> {
        let names = [
            "web.default.svc.cluster.local.",
            "db.data.svc.cluster.local.",
            "db-0.db.data.svc.cluster.local.",
            "10-244-2-7.db.data.svc.cluster.local.",
            "_pg._tcp.db.data.svc.cluster.local.",
            "_http._tcp.web.default.svc.cluster.local.",
            "ext.default.svc.cluster.local.",
            "data.svc.cluster.local.",
            "default.svc.cluster.local.",
            "5.1.244.10.in-addr.arpa.",
            "7.2.244.10.in-addr.arpa.",
            "20.0.96.10.in-addr.arpa.",
        ];
        let mut out = vec![];
        for n in names {
            for t in [RecordType::A, RecordType::SRV, RecordType::PTR] {
                let a = ask(z, n, t);
                let mut answers = texts(&a.answers);
                answers.sort();
                out.push(format!("{n} {t}: {} {answers:?}", a.code));
            }
        }
        out
    }

    #[test]
    fn changes_one_at_a_time_end_where_a_fresh_build_does() {
        let full = zone();
        let cfg = Config::new("cluster.local", 30).unwrap();
        let mut z = Zone::new(cfg.clone());
        // Slices before their Services, a Service changed, one deleted and re-added.
        let slice = SliceRecord {
            service: Some("data/db".into()),
            ports: vec![NamedPort { name: "pg".into(), proto: "tcp".into(), port: 5432 }],
            endpoints: vec![
                Endpoint { ips: vec!["10.244.1.5".parse().unwrap()], hostname: Some("db-0".into()), ready: true },
                Endpoint { ips: vec!["10.244.2.7".parse().unwrap()], hostname: None, ready: true },
                Endpoint { ips: vec!["10.244.2.9".parse().unwrap()], hostname: None, ready: false },
            ],
        };
        z.set_slice("data/db-x".into(), slice.clone());
        z.set_service("data/db".into(), ServiceRecord::Headless { publish_not_ready: false });
        z.set_service("data/empty".into(), ServiceRecord::Headless { publish_not_ready: false });
        z.set_service(
            "default/web".into(),
            ServiceRecord::ClusterIp { ips: vec!["10.96.0.99".parse().unwrap()], ports: vec![] },
        );
        let web = ServiceRecord::ClusterIp {
            ips: vec!["10.96.0.20".parse().unwrap()],
            ports: vec![NamedPort { name: "http".into(), proto: "tcp".into(), port: 80 }],
        };
        z.set_service("default/web".into(), web);
        z.set_service("default/ext".into(), ServiceRecord::External(name("example.org").unwrap()));
        assert_eq!(snapshot(&z), snapshot(&full));
        // The old cluster IP no longer answers.
        assert_eq!(ask(&z, "99.0.96.10.in-addr.arpa.", RecordType::PTR).code, ResponseCode::Refused);

        let before = z.serial();
        z.delete_slice("data/db-x");
        assert!(z.serial() > before, "every change moves the SOA serial");
        assert_eq!(ask(&z, "db.data.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
        assert_eq!(ask(&z, "5.1.244.10.in-addr.arpa.", RecordType::PTR).code, ResponseCode::Refused);
        z.delete_service("default/web");
        assert_eq!(ask(&z, "web.default.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
        z.delete_service("default/ext");
        assert_eq!(
            ask(&z, "default.svc.cluster.local.", RecordType::A).code,
            ResponseCode::NXDomain,
            "no Service left in default"
        );

        // A relist puts everything back, whatever was there.
        z.set_service("other/stale".into(), ServiceRecord::Headless { publish_not_ready: true });
        z.replace_services(
            [
                ("data/db", ServiceRecord::Headless { publish_not_ready: false }),
                ("data/empty", ServiceRecord::Headless { publish_not_ready: false }),
                ("default/ext", ServiceRecord::External(name("example.org").unwrap())),
                (
                    "default/web",
                    ServiceRecord::ClusterIp {
                        ips: vec!["10.96.0.20".parse().unwrap()],
                        ports: vec![NamedPort { name: "http".into(), proto: "tcp".into(), port: 80 }],
                    },
                ),
            ]
            .map(|(k, r)| (k.to_string(), r)),
        );
        z.replace_slices([("data/db-x".to_string(), slice)]);
        assert_eq!(snapshot(&z), snapshot(&full));
        assert_eq!(z.len(), (4, 1));
        assert_eq!(ask(&z, "stale.other.svc.cluster.local.", RecordType::A).code, ResponseCode::NXDomain);
    }

    #[test]
    fn not_ready_endpoints_are_published_when_the_service_says_so() {
        let mut z = Zone::new(Config::new("cluster.local", 5).unwrap());
        z.set_service("ns/h".into(), ServiceRecord::Headless { publish_not_ready: true });
        z.set_slice(
            "ns/h-1".into(),
            SliceRecord {
                service: Some("ns/h".into()),
                ports: vec![],
                endpoints: vec![Endpoint { ips: vec!["fd00::5".parse().unwrap()], hostname: None, ready: false }],
            },
        );
        let a = ask(&z, "h.ns.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(texts(&a.answers), ["h.ns.svc.cluster.local. 5 IN AAAA fd00::5"]);
        assert_eq!(ask(&z, "h.ns.svc.cluster.local.", RecordType::A).code, ResponseCode::NoError);
        assert_eq!(ask(&z, "fd00--5.h.ns.svc.cluster.local.", RecordType::AAAA).answers.len(), 1);
    }
}
