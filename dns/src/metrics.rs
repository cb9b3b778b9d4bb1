//! Counters in the Prometheus text format, under CoreDNS's metric names (`coredns_dns_*`), so
//! dashboards and lessons written for CoreDNS read them: requests by protocol, family and
//! query type, responses by rcode. Counting is lock-striped by nothing fancier than a mutex
//! around a small map; rendering is pure.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// What one answered query adds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Observation {
    /// `udp` or `tcp`.
    pub proto: &'static str,
    /// `1` (IPv4) or `2` (IPv6), CoreDNS's label values.
    pub family: &'static str,
    /// The query type (`A`, `SRV` …).
    pub qtype: String,
    /// The response code (`NOERROR`, `NXDOMAIN` …).
    pub rcode: String,
}

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, &'static str, String), u64>>,
    responses: Mutex<BTreeMap<String, u64>>,
}

impl Metrics {
    pub fn observe(&self, o: Observation) {
        *self.requests.lock().unwrap_or_else(|e| e.into_inner()).entry((o.proto, o.family, o.qtype)).or_default() += 1;
        *self.responses.lock().unwrap_or_else(|e| e.into_inner()).entry(o.rcode).or_default() += 1;
    }

    /// The exposition text, for `zone` (`cluster.local.`).
    pub fn render(&self, zone: &str) -> String {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let responses = self.responses.lock().unwrap_or_else(|e| e.into_inner()).clone();
        render(zone, &requests, &responses)
    }
}

/// Pure rendering of the counters.
pub fn render(
    zone: &str,
    requests: &BTreeMap<(&'static str, &'static str, String), u64>,
    responses: &BTreeMap<String, u64>,
) -> String {
    let mut out = String::new();
    out.push_str("# HELP coredns_dns_requests_total Counter of DNS requests made per zone, protocol and family.\n");
    out.push_str("# TYPE coredns_dns_requests_total counter\n");
    for ((proto, family, qtype), n) in requests {
        out.push_str(&format!(
            "coredns_dns_requests_total{{server=\"dns://:53\",zone=\"{zone}\",view=\"\",proto=\"{proto}\",family=\"{family}\",type=\"{qtype}\"}} {n}\n"
        ));
    }
    out.push_str("# HELP coredns_dns_responses_total Counter of response status codes.\n");
    out.push_str("# TYPE coredns_dns_responses_total counter\n");
    for (rcode, n) in responses {
        out.push_str(&format!(
            "coredns_dns_responses_total{{server=\"dns://:53\",zone=\"{zone}\",view=\"\",plugin=\"kubernetes\",rcode=\"{rcode}\"}} {n}\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_in_the_prometheus_text_format() {
        let m = Metrics::default();
        let o = |proto, qtype: &str, rcode: &str| Observation {
            proto,
            family: "1",
            qtype: qtype.into(),
            rcode: rcode.into(),
        };
        m.observe(o("udp", "A", "NOERROR"));
        m.observe(o("udp", "A", "NXDOMAIN"));
        m.observe(o("tcp", "SRV", "NOERROR"));
        let text = m.render("cluster.local.");
        assert!(text.contains(
            "coredns_dns_requests_total{server=\"dns://:53\",zone=\"cluster.local.\",view=\"\",proto=\"udp\",family=\"1\",type=\"A\"} 2\n"
        ));
        assert!(text.contains("proto=\"tcp\",family=\"1\",type=\"SRV\"} 1\n"));
        assert!(text.contains("plugin=\"kubernetes\",rcode=\"NOERROR\"} 2\n"));
        assert!(text.contains("rcode=\"NXDOMAIN\"} 1\n"));
        assert_eq!(text.matches("# TYPE").count(), 2);
    }
}
