//! nftables as tests read it back.

use std::process::Command;

/// `nft -j list table FAMILY TABLE` in network namespace `netns`, with every `handle` removed
/// (two namespaces number their rules apart), for comparing two kernels' tables.
pub fn listed_json(netns: &str, family: &str, table: &str) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-j", "list", "table", family, table])
        .output()
        .expect("run nft");
    assert!(
        out.status.success(),
        "nft -j list table {family} {table} in {netns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nft -j prints JSON");
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("handle");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}
