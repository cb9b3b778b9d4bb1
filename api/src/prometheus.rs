//! The Prometheus text exposition format, read back (what a scraper does with a `/metrics`
//! page: metrics-server with the kubelet's `/metrics/resource`). Pure.

use std::collections::BTreeMap;

/// One sample of a scrape: (metric name, labels, value, timestamp ms).
pub type Sample = (String, BTreeMap<String, String>, f64, Option<i64>);

/// Reads samples back from the text format (what metrics-server does with the page).
pub fn parse(text: &str) -> Vec<Sample> {
    let mut out = vec![];
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (name_labels, rest) = match line.find('}') {
            Some(i) => (&line[..=i], &line[i + 1..]),
            None => match line.split_once(' ') {
                Some((n, r)) => (n, r),
                None => continue,
            },
        };
        let (name, labels) = match name_labels.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (name_labels, ""),
        };
        let mut map = BTreeMap::new();
        for kv in labels.split(',').filter(|s| !s.is_empty()) {
            if let Some((k, v)) = kv.split_once('=') {
                map.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
            }
        }
        let mut f = rest.split_whitespace();
        let Some(value) = f.next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        let ts = f.next().and_then(|t| t.parse::<i64>().ok());
        out.push((name.to_string(), map, value, ts));
    }
    out
}
