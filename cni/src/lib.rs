//! podpath's CNI plugins (spec 1.1.0; configs asking for 0.3.0–1.1.0 are answered in their
//! version's format).
//!
//! - [`env`](mod@env), [`version`], [`types`], [`error`]: the spec's types, re-exported from
//!   `podpath-cni-spec` (the kubelet shares them);
//! - [`bridge`]: `podpath-bridge`, the interface plugin;
//! - [`ipam`]: `podpath-ipam`, host-local-compatible address management.
//!
//! [`run_plugin`] is the part every plugin binary shares: parse, check, dispatch, print.
//!
//! What it is not: the reference plugins (the tests compare with Debian's
//! `containernetworking-plugins`), a runtime (the kubelet runs plugins), or IPv6.

pub mod bridge;
pub mod ipam;
pub use podpath_cni_spec::{env, error, types, version};

use serde_json::Value;

use env::{Command, EnvSource, Invocation};
use error::{code, CniError};

/// What one plugin run prints and how it exits.
#[derive(Debug)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub exit_code: i32,
}

/// Runs one plugin invocation: checks the environment and the config, then calls `handle` with
/// the invocation, the whole config and its `cniVersion`. `handle` returns the result to print
/// (ADD) or nothing (DEL, CHECK, STATUS, GC). Errors become the spec's error JSON on stdout.
pub fn run_plugin(
    env: &dyn EnvSource,
    stdin: &[u8],
    known_args: &[&str],
    handle: impl FnOnce(&Invocation, &Value, &str) -> error::Result<Option<Value>>,
) -> Output {
    let config: Option<Value> = serde_json::from_slice(stdin).ok();
    let asked = config.as_ref().and_then(|c| c.get("cniVersion")).and_then(Value::as_str).map(str::to_string);
    let reply_version = asked
        .clone()
        .filter(|v| version::SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| version::CURRENT.to_string());
    let fail = |e: CniError| Output { stdout: line(&e.to_json(&reply_version)), exit_code: 1 };
    let inv = match env::parse(env, known_args) {
        Ok(inv) => inv,
        Err(e) => return fail(e),
    };
    if inv.command == Command::Version {
        return Output { stdout: line(&version::version_json(stdin)), exit_code: 0 };
    }
    let Some(config) = config.filter(Value::is_object) else {
        let detail = match serde_json::from_slice::<Value>(stdin) {
            Err(e) => e.to_string(),
            Ok(_) => "the config must be a JSON object".into(),
        };
        return fail(CniError::new(code::DECODE, "failed to decode the network config on stdin").with_details(detail));
    };
    // A config without cniVersion is a 0.1.0 config, which podpath does not speak.
    let asked = asked.unwrap_or_else(|| "0.1.0".into());
    if let Err(e) = version::check(&asked, inv.command) {
        return fail(e);
    }
    match handle(&inv, &config, &asked) {
        Ok(Some(result)) => Output { stdout: line(&result), exit_code: 0 },
        Ok(None) => Output { stdout: Vec::new(), exit_code: 0 },
        Err(e) => fail(e),
    }
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(cmd: &str) -> HashMap<String, String> {
        [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn json_out(o: &Output) -> Value {
        serde_json::from_slice(&o.stdout).unwrap()
    }

    #[test]
    fn version_works_with_any_stdin() {
        let o = run_plugin(&env("VERSION"), b"", &[], |_, _, _| unreachable!());
        assert_eq!((o.exit_code, json_out(&o)["cniVersion"].as_str()), (0, Some("1.1.0")));
        let o = run_plugin(&env("VERSION"), br#"{"cniVersion":"0.4.0"}"#, &[], |_, _, _| unreachable!());
        assert_eq!(json_out(&o)["cniVersion"], "0.4.0");
    }

    #[test]
    fn input_errors_have_their_codes_and_the_config_version() {
        let o = run_plugin(&env("ADD"), b"{nope", &[], |_, _, _| unreachable!());
        assert_eq!((o.exit_code, json_out(&o)["code"].as_u64()), (1, Some(6)));
        let o = run_plugin(&env("ADD"), b"", &[], |_, _, _| unreachable!());
        assert_eq!(json_out(&o)["code"], 6);
        let o = run_plugin(&env("ADD"), br#"{"name":"x"}"#, &[], |_, _, _| unreachable!());
        assert_eq!(json_out(&o)["code"], 1);
        let o = run_plugin(&env("ADD"), br#"{"cniVersion":"7.0.0","name":"x"}"#, &[], |_, _, _| unreachable!());
        assert_eq!(json_out(&o)["code"], 1);
        let mut e = env("ADD");
        e.remove("CNI_IFNAME");
        let o = run_plugin(&e, br#"{"cniVersion":"0.4.0","name":"x"}"#, &[], |_, _, _| unreachable!());
        let err = json_out(&o);
        assert_eq!((err["code"].as_u64(), err["cniVersion"].as_str()), (Some(4), Some("0.4.0")));
        let o = run_plugin(&env("DEL"), br#"{"cniVersion":"1.0.0","name":"x"}"#, &[], |_, _, _| Ok(None));
        assert_eq!((o.exit_code, o.stdout.len()), (0, 0));
    }
}
