//! The `CNI_*` environment of one invocation, parsed and checked (pure: the environment comes in
//! through [`EnvSource`], so tests never touch the process environment).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{code, CniError, Result};

/// Where `CNI_*` variables come from.
pub trait EnvSource {
    fn get(&self, key: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl EnvSource for HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        HashMap::get(self, key).cloned()
    }
}

/// `CNI_COMMAND`: what the runtime asks a plugin to do (the plugins parse it, the node agent
/// sends it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One invocation's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    /// Empty for STATUS, GC and VERSION.
    pub container_id: String,
    /// May be absent for DEL.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    /// `CNI_ARGS` pairs, in order.
    pub args: Vec<(String, String)>,
    pub path: Vec<PathBuf>,
}

impl Invocation {
    /// A `CNI_ARGS` value.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
}

/// Why an interface name cannot be used, if it cannot.
pub fn ifname_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("may not be . or ..")
    } else if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        Some("may not contain '/', ':' or whitespace")
    } else {
        None
    }
}

/// Parses and checks the environment for the command it names.
/// `known_args` are the `CNI_ARGS` keys the plugin understands; others are an error unless
/// `IgnoreUnknown=1` (as the reference plugins do).
pub fn parse(env: &dyn EnvSource, known_args: &[&str]) -> Result<Invocation> {
    let missing = |name: &str| CniError::new(code::INVALID_ENV, format!("required env variable {name} missing"));
    let command = match env.get("CNI_COMMAND").as_deref() {
        None | Some("") => return Err(missing("CNI_COMMAND")),
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some("STATUS") => Command::Status,
        Some("GC") => Command::Gc,
        Some("VERSION") => Command::Version,
        Some(other) => return Err(CniError::new(code::INVALID_ENV, format!("unknown CNI_COMMAND: {other}"))),
    };
    let attachment = matches!(command, Command::Add | Command::Del | Command::Check);
    let mut inv = Invocation {
        command,
        container_id: String::new(),
        netns: None,
        ifname: String::new(),
        args: Vec::new(),
        path: Vec::new(),
    };
    if command == Command::Version {
        return Ok(inv);
    }
    if attachment {
        inv.container_id =
            env.get("CNI_CONTAINERID").filter(|s| !s.is_empty()).ok_or_else(|| missing("CNI_CONTAINERID"))?;
        if !valid_container_id(&inv.container_id) {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("invalid CNI_CONTAINERID {:?}: must match ^[A-Za-z0-9][A-Za-z0-9_.-]*$", inv.container_id),
            ));
        }
        inv.ifname = env.get("CNI_IFNAME").filter(|s| !s.is_empty()).ok_or_else(|| missing("CNI_IFNAME"))?;
        if let Some(problem) = ifname_problem(&inv.ifname) {
            return Err(CniError::new(code::INVALID_ENV, format!("invalid CNI_IFNAME {:?}: it {problem}", inv.ifname)));
        }
        inv.netns = env.get("CNI_NETNS").filter(|s| !s.is_empty()).map(PathBuf::from);
        if inv.netns.is_none() && command != Command::Del {
            return Err(missing("CNI_NETNS"));
        }
        let raw = env.get("CNI_ARGS").unwrap_or_default();
        for pair in raw.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                CniError::new(code::INVALID_ENV, format!("invalid CNI_ARGS pair {pair:?}: expected KEY=VALUE"))
            })?;
            inv.args.push((k.to_string(), v.to_string()));
        }
        let ignore_unknown = inv.arg("IgnoreUnknown").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        if !ignore_unknown {
            if let Some((k, _)) =
                inv.args.iter().find(|(k, _)| k != "IgnoreUnknown" && !known_args.contains(&k.as_str()))
            {
                return Err(CniError::new(
                    code::INVALID_ENV,
                    format!("unknown CNI_ARGS key {k:?} (set IgnoreUnknown=1 to ignore it)"),
                ));
            }
        }
    }
    let path = env.get("CNI_PATH").unwrap_or_default();
    inv.path = path.split(':').filter(|p| !p.is_empty()).map(PathBuf::from).collect();
    if inv.path.is_empty() && (attachment || command == Command::Gc) {
        return Err(missing("CNI_PATH"));
    }
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn add_env() -> Vec<(&'static str, &'static str)> {
        vec![
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "ctr-1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni:/opt/cni/bin"),
            ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web;K8S_POD_NAMESPACE=default"),
        ]
    }

    #[test]
    fn parses_an_add() {
        let inv = parse(&env(&add_env()), &[]).unwrap();
        assert_eq!(inv.command, Command::Add);
        assert_eq!(inv.arg("K8S_POD_NAME"), Some("web"));
        assert_eq!(inv.path.len(), 2);
    }

    #[test]
    fn errors_name_the_variable_and_use_code_4() {
        let cases: Vec<(&str, Option<&str>, &str)> = vec![
            ("CNI_COMMAND", None, "CNI_COMMAND"),
            ("CNI_COMMAND", Some("FOO"), "unknown CNI_COMMAND"),
            ("CNI_CONTAINERID", None, "CNI_CONTAINERID"),
            ("CNI_CONTAINERID", Some("-bad"), "invalid CNI_CONTAINERID"),
            ("CNI_IFNAME", Some("averyveryverylongname"), "longer than 15"),
            ("CNI_IFNAME", Some("a/b"), "may not contain"),
            ("CNI_NETNS", None, "CNI_NETNS"),
            ("CNI_PATH", None, "CNI_PATH"),
            ("CNI_ARGS", Some("FOO=1"), "unknown CNI_ARGS key"),
            ("CNI_ARGS", Some("junk"), "invalid CNI_ARGS pair"),
        ];
        for (key, value, want) in cases {
            let mut e = env(&add_env());
            match value {
                Some(v) => e.insert(key.to_string(), v.to_string()),
                None => e.remove(key),
            };
            let err = parse(&e, &[]).unwrap_err();
            assert_eq!(err.code, 4, "{key}");
            assert!(err.msg.contains(want), "{key}: {}", err.msg);
        }
    }

    #[test]
    fn del_needs_no_netns_and_version_needs_nothing() {
        let mut e = env(&add_env());
        e.insert("CNI_COMMAND".into(), "DEL".into());
        e.remove("CNI_NETNS");
        assert!(parse(&e, &[]).unwrap().netns.is_none());
        assert_eq!(parse(&env(&[("CNI_COMMAND", "VERSION")]), &[]).unwrap().command, Command::Version);
        assert!(parse(&env(&[("CNI_COMMAND", "STATUS")]), &[]).is_ok());
        assert_eq!(parse(&env(&[("CNI_COMMAND", "GC")]), &[]).unwrap_err().code, 4);
    }
}
