//! Kubernetes resource quantities (`500m`, `2`, `1.5`, `128Mi`, `1G`, `1e3`) as numbers, and a
//! pod's effective requests as the scheduler counts them. Pure.

use std::collections::BTreeMap;

use serde_json::Value;

/// A quantity in thousandths of its unit, rounded up (cpu `500m` → 500, `2` → 2000; memory
/// `1Ki` → 1,024,000). None when it is not a quantity.
pub fn milli(q: &str) -> Option<i128> {
    let q = q.trim();
    let end = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(end);
    if num.is_empty() {
        return None;
    }
    let (scale, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        s => {
            let e = s.strip_prefix(['e', 'E'])?.parse::<i32>().ok()?;
            (1, e)
        }
    };
    // The number as an integer mantissa and a power of ten, exactly.
    let negative = num.starts_with('-');
    let digits = num.trim_start_matches(['+', '-']);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mantissa: i128 = format!("{int}{frac}").parse().ok()?;
    let mut power = exp10 + 3 - frac.len() as i32;
    let mut value = mantissa.checked_mul(scale)?;
    while power > 0 {
        value = value.checked_mul(10)?;
        power -= 1;
    }
    if power < 0 {
        let div = 10i128.checked_pow((-power) as u32)?;
        value = (value + div - 1) / div;
    }
    Some(if negative { -value } else { value })
}

/// What a pod asks of its node, in thousandths (cpu in millicores): per resource, the larger
/// of its containers' summed requests and its largest init container's (kubelet and the
/// scheduler count it so); a container's limit stands for a request it does not state.
pub fn pod_requests(pod: &Value) -> BTreeMap<String, i128> {
    let of = |c: &Value| -> BTreeMap<String, i128> {
        let mut out = BTreeMap::new();
        for part in ["limits", "requests"] {
            for (k, v) in c["resources"][part].as_object().into_iter().flatten() {
                if let Some(n) = v.as_str().and_then(milli).or_else(|| v.as_i64().map(|n| i128::from(n) * 1000)) {
                    out.insert(k.clone(), n);
                }
            }
        }
        out
    };
    let mut sum: BTreeMap<String, i128> = BTreeMap::new();
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (k, v) in of(c) {
            *sum.entry(k).or_default() += v;
        }
    }
    for c in pod["spec"]["initContainers"].as_array().into_iter().flatten() {
        for (k, v) in of(c) {
            let e = sum.entry(k).or_default();
            *e = (*e).max(v);
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_read_as_the_api_writes_them() {
        for (q, want) in [
            ("500m", 500),
            ("2", 2000),
            ("1.5", 1500),
            ("0.1", 100),
            ("1Ki", 1_024_000),
            ("128Mi", 128 * 1024 * 1024 * 1000),
            ("1G", 1_000_000_000_000),
            ("1e3", 1_000_000),
            ("250u", 1),
        ] {
            assert_eq!(milli(q), Some(want), "{q}");
        }
        for bad in ["", "Mi", "1.2.3", "1Xi", "abc"] {
            assert_eq!(milli(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_pods_requests_sum_its_containers_and_take_the_largest_init_container() {
        let pod = json!({"spec": {
        "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
        "containers": [
            {"resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
            {"resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}},
            {}
        ]}});
        let r = pod_requests(&pod);
        assert_eq!(r["cpu"], 2000, "the init container's 2 cpus outweigh 750m");
        assert_eq!(r["memory"], 192 * 1024 * 1024 * 1000);
    }
}
