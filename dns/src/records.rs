//! The cluster zone as CoreDNS's `kubernetes` plugin serves it (the Kubernetes DNS-based
//! service discovery specification, with kubeadm's Corefile choices: `pods insecure`, TTL 30,
//! reverse zones): the records are built from Services and EndpointSlices ([`Zone::build`]) and
//! a question gets its answer from them ([`Zone::answer`]). Pure: no sockets, no clock.

use std::collections::{BTreeMap, HashMap, HashSet};
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
}

impl Config {
    pub fn new(domain: &str, ttl: u32) -> Result<Config, String> {
        let mut d = Name::from_ascii(domain).map_err(|e| format!("invalid cluster domain {domain:?}: {e}"))?;
        d.set_fqdn(true);
        Ok(Config { domain: d.to_lowercase(), ttl })
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
    fn refused() -> Answer {
        Answer { code: ResponseCode::Refused, answers: vec![], authority: vec![], additional: vec![] }
    }
}

/// The cluster zone at one moment.
#[derive(Debug, Clone)]
pub struct Zone {
    cfg: Config,
    /// Records by owner name (lower case, fully qualified), in-zone and reverse.
    records: HashMap<Name, Vec<Record>>,
    /// Every name of the zone that exists: owners and the names between them and the apex
    /// (`default.svc.cluster.local` exists when a Service in `default` does), for NODATA.
    exists: HashSet<Name>,
    soa: Record,
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

/// A named port of a Service or EndpointSlice: (name, protocol, port).
type NamedPort = (String, String, u16);

/// Builds the records of the zone.
struct Builder {
    ttl: u32,
    domain: Name,
    records: HashMap<Name, Vec<Record>>,
    exists: HashSet<Name>,
}

impl Builder {
    fn add(&mut self, r: Record) {
        let owner = r.name.to_lowercase();
        if self.domain.zone_of(&owner) {
            let mut n = owner.clone();
            while n.num_labels() > self.domain.num_labels() {
                self.exists.insert(n.clone());
                n = n.base_name();
            }
        }
        let rs = self.records.entry(owner).or_default();
        if !rs.contains(&r) {
            rs.push(r);
        }
    }

    /// SRV records `_<port>._<proto>.<base>` for named ports, one per target, each target's
    /// address in the zone too. CoreDNS gives every record of a set the same weight, splitting
    /// 100 between them.
    fn srv(&mut self, base: &Name, ports: &[NamedPort], targets: &[Name]) {
        let weight = (100 / targets.len().max(1)).max(1) as u16;
        for (port_name, proto, port) in ports {
            let owner = format!("_{}._{}.{}", port_name.to_lowercase(), proto.to_lowercase(), base);
            let Some(owner) = name(&owner) else { continue };
            for t in targets {
                let srv = SRV::new(0, weight, *port, t.clone());
                self.add(Record::from_rdata(owner.clone(), self.ttl, RData::SRV(srv)));
            }
        }
    }
}

fn ready_addresses(slices: &[&EndpointSlice], publish_not_ready: bool) -> Vec<(IpAddr, Option<String>)> {
    let mut out = vec![];
    for s in slices {
        for e in &s.endpoints {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready && !publish_not_ready {
                continue;
            }
            for a in &e.addresses {
                if let Ok(ip) = a.parse::<IpAddr>() {
                    if !out.iter().any(|(o, _)| *o == ip) {
                        out.push((ip, e.hostname.clone()));
                    }
                }
            }
        }
    }
    out
}

impl Zone {
    /// The zone for these Services and their EndpointSlices (matched by the
    /// `kubernetes.io/service-name` label), with SOA serial `serial`.
    pub fn build(cfg: Config, services: &[Service], slices: &[EndpointSlice], serial: u32) -> Zone {
        let ttl = cfg.ttl;
        let mut b = Builder { ttl, domain: cfg.domain.clone(), records: HashMap::new(), exists: HashSet::new() };
        let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
        for s in slices {
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            if let Some(svc) = s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")) {
                by_service.entry((ns, svc.clone())).or_default().push(s);
            }
        }
        if let Some(v) = name(&format!("dns-version.{}", cfg.domain)) {
            b.add(Record::from_rdata(v, ttl, RData::TXT(TXT::new(vec![SCHEMA_VERSION.into()]))));
        }
        for svc in services {
            let (Some(svc_name), ns) =
                (svc.metadata.name.as_deref(), svc.metadata.namespace.as_deref().unwrap_or("default"))
            else {
                continue;
            };
            let Some(base) = name(&format!("{svc_name}.{ns}.svc.{}", cfg.domain)) else { continue };
            let Some(spec) = svc.spec.as_ref() else { continue };
            if spec.type_.as_deref() == Some("ExternalName") {
                if let Some(target) = spec.external_name.as_deref().and_then(name) {
                    b.add(Record::from_rdata(base.clone(), ttl, RData::CNAME(CNAME(target))));
                }
                continue;
            }
            let headless = spec.cluster_ip.as_deref() == Some("None");
            if headless {
                let slices = by_service.get(&(ns.to_string(), svc_name.to_string())).cloned().unwrap_or_default();
                let publish = spec.publish_not_ready_addresses == Some(true);
                let mut ports: Vec<NamedPort> = vec![];
                for s in &slices {
                    for p in s.ports.iter().flatten() {
                        if let (Some(n), Some(port)) = (p.name.as_deref().filter(|n| !n.is_empty()), p.port) {
                            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                            let np = (n.to_string(), proto, port as u16);
                            if !ports.contains(&np) {
                                ports.push(np);
                            }
                        }
                    }
                }
                let mut targets = vec![];
                for (ip, hostname) in ready_addresses(&slices, publish) {
                    let label = hostname.filter(|h| !h.is_empty()).unwrap_or_else(|| dashed(ip));
                    let Some(host) = name(&format!("{label}.{base}")) else { continue };
                    b.add(address(&base, ttl, ip));
                    b.add(address(&host, ttl, ip));
                    b.add(Record::from_rdata(reverse_name(ip), ttl, RData::PTR(PTR(host.clone()))));
                    if !targets.contains(&host) {
                        targets.push(host);
                    }
                }
                b.srv(&base, &ports, &targets);
                continue;
            }
            let ips: Vec<IpAddr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|ip| ip.parse().ok())
                .collect();
            if ips.is_empty() {
                continue;
            }
            for ip in &ips {
                b.add(address(&base, ttl, *ip));
                b.add(Record::from_rdata(reverse_name(*ip), ttl, RData::PTR(PTR(base.clone()))));
            }
            let ports: Vec<NamedPort> = spec
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let n = p.name.as_deref().filter(|n| !n.is_empty())?;
                    Some((n.to_string(), p.protocol.clone().unwrap_or_else(|| "TCP".into()), p.port as u16))
                })
                .collect();
            b.srv(&base, &ports, std::slice::from_ref(&base));
        }
        let soa = SOA::new(
            name(&format!("ns.dns.{}", cfg.domain)).expect("valid"),
            name(&format!("hostmaster.{}", cfg.domain)).expect("valid"),
            serial,
            7200,
            1800,
            86400,
            ttl,
        );
        let soa = Record::from_rdata(cfg.domain.clone(), ttl, RData::SOA(soa));
        Zone { cfg, records: b.records, exists: b.exists, soa }
    }

    /// The answer to `qname` `qtype`: the zone's records; NODATA (no error, no records, the
    /// SOA) for a name that exists without records of that type; NXDOMAIN (with the SOA) for
    /// a name of the zone that does not exist; REFUSED for names that are not the cluster's
    /// (the lab has no upstream to forward them to).
    pub fn answer(&self, qname: &Name, qtype: RecordType) -> Answer {
        let mut q = qname.to_lowercase();
        q.set_fqdn(true);
        let in_zone = self.cfg.domain.zone_of(&q);
        if !in_zone {
            // Reverse names of the cluster's addresses are answered; other reverse names, as
            // every other name, would go upstream.
            return match self.records.get(&q) {
                Some(rs) => self.positive(rs, qtype),
                None => Answer::refused(),
            };
        }
        if q == self.cfg.domain {
            return match qtype {
                RecordType::SOA | RecordType::ANY => self.with(vec![self.soa.clone()]),
                _ => self.negative(ResponseCode::NoError),
            };
        }
        if let Some(a) = self.pod_answer(&q, qtype) {
            return a;
        }
        match self.records.get(&q) {
            Some(rs) => self.positive(rs, qtype),
            None if self.exists.contains(&q) => self.negative(ResponseCode::NoError),
            None => self.negative(ResponseCode::NXDomain),
        }
    }

    /// `a-b-c-d.<ns>.pod.<zone>` (CoreDNS `pods insecure`: any such name answers its address).
    fn pod_answer(&self, q: &Name, qtype: RecordType) -> Option<Answer> {
        let zone_labels = self.cfg.domain.num_labels();
        if q.num_labels() != zone_labels + 3 {
            return None;
        }
        let labels: Vec<String> = q.iter().map(|l| String::from_utf8_lossy(l).into_owned()).collect();
        if labels[2] != "pod" {
            return None;
        }
        let ip: std::net::Ipv4Addr = labels[0].replace('-', ".").parse().ok()?;
        Some(match qtype {
            RecordType::A | RecordType::ANY => self.with(vec![address(q, self.cfg.ttl, IpAddr::V4(ip))]),
            _ => self.negative(ResponseCode::NoError),
        })
    }

    fn with(&self, answers: Vec<Record>) -> Answer {
        Answer { code: ResponseCode::NoError, answers, authority: vec![], additional: vec![] }
    }

    fn negative(&self, code: ResponseCode) -> Answer {
        Answer { code, answers: vec![], authority: vec![self.soa.clone()], additional: vec![] }
    }

    fn positive(&self, rs: &[Record], qtype: RecordType) -> Answer {
        // A name with a CNAME has nothing else: the CNAME answers every type (the target is
        // outside the cluster, and there is no upstream to follow it).
        let cname: Vec<Record> = rs.iter().filter(|r| r.record_type() == RecordType::CNAME).cloned().collect();
        let answers: Vec<Record> = if !cname.is_empty() {
            cname
        } else {
            rs.iter().filter(|r| qtype == RecordType::ANY || r.record_type() == qtype).cloned().collect()
        };
        if answers.is_empty() {
            return self.negative(ResponseCode::NoError);
        }
        let mut additional = vec![];
        for r in &answers {
            if let RData::SRV(srv) = &r.data {
                for t in self.records.get(&srv.target.to_lowercase()).into_iter().flatten() {
                    if matches!(t.record_type(), RecordType::A | RecordType::AAAA) && !additional.contains(t) {
                        additional.push(t.clone());
                    }
                }
            }
        }
        Answer { code: ResponseCode::NoError, answers, authority: vec![], additional }
    }
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
}
