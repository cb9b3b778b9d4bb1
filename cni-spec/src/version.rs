//! CNI spec versions: what podpath's plugins accept, and which commands each version has.

use serde_json::{json, Value};

use crate::env::Command;
use crate::error::{code, CniError, Result};

/// Versions a config may ask for; results are printed in the asked version's format.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The version podpath implements.
pub const CURRENT: &str = "1.1.0";

fn parse(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    let out = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(out)
}

/// Checks a config's `cniVersion` against the command (CHECK needs 0.4.0, STATUS and GC 1.1.0).
pub fn check(version: &str, command: Command) -> Result<()> {
    if !SUPPORTED.contains(&version) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("incompatible CNI versions: config is {version:?}, plugin supports {SUPPORTED:?}"),
        ));
    }
    let v = parse(version).expect("supported versions parse");
    let needs = match command {
        Command::Check => Some((0, 4, 0)),
        Command::Status | Command::Gc => Some((1, 1, 0)),
        _ => None,
    };
    if let Some(n) = needs {
        if v < n {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "config version {version} does not allow {} (needs {}.{}.{} or later)",
                    command.as_str(),
                    n.0,
                    n.1,
                    n.2
                ),
            ));
        }
    }
    Ok(())
}

/// Whether results of this version carry `ips[].version` (0.3.x and 0.4.0 do; 1.x does not).
pub fn has_ip_version(version: &str) -> bool {
    version.starts_with("0.")
}

/// Whether this version knows the 1.1.0 result fields (interface mtu, route mtu/table/…).
pub fn is_1_1(version: &str) -> bool {
    parse(version).is_some_and(|v| v >= (1, 1, 0))
}

/// The VERSION answer: echoes the asked version when it is one of ours.
pub fn version_json(stdin: &[u8]) -> Value {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string))
        .filter(|v| SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| CURRENT.to_string());
    json!({"cniVersion": asked, "supportedVersions": SUPPORTED})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_commands() {
        assert!(check("1.0.0", Command::Add).is_ok());
        assert!(check("0.3.1", Command::Add).is_ok());
        assert_eq!(check("0.2.0", Command::Add).unwrap_err().code, 1);
        assert_eq!(check("9.9.9", Command::Add).unwrap_err().code, 1);
        assert_eq!(check("0.3.1", Command::Check).unwrap_err().code, 1);
        assert!(check("0.4.0", Command::Check).is_ok());
        assert_eq!(check("1.0.0", Command::Status).unwrap_err().code, 1);
        assert!(check("1.1.0", Command::Gc).is_ok());
        assert_eq!(version_json(br#"{"cniVersion":"0.4.0"}"#)["cniVersion"], "0.4.0");
        assert_eq!(version_json(b"junk")["cniVersion"], "1.1.0");
        assert_eq!(version_json(b"")["supportedVersions"].as_array().unwrap().len(), 5);
    }
}
