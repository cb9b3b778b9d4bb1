//! The bridge plugin's commands. ADD records an undo step for everything it creates and rolls
//! back on any failure, so a failed ADD leaves nothing behind. DEL is best-effort and works
//! without the netns: names are deterministic, so the host veth and the NAT chain are found
//! without asking the container.

use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use serde_json::Value;

use super::config::{host_veth_name, masq_chain, masq_comment, BridgeConfig};
use super::dataplane::Dataplane;
use crate::env::{Command, Invocation};
use crate::error::{code, CniError, Result};
use crate::types::{CniResult, Interface, Route};

/// Runs a delegated plugin (IPAM).
pub trait Delegate {
    /// Runs `plugin` with `command`, the invocation's environment and `stdin`; returns its
    /// stdout on success and its error (code passed through) on failure.
    fn run(&mut self, plugin: &str, command: Command, inv: &Invocation, stdin: &[u8]) -> Result<Vec<u8>>;
}

/// Finds plugins through `CNI_PATH` and execs them, as the spec says.
pub struct ExecDelegate;

pub fn find_plugin(name: &str, path: &[PathBuf]) -> Result<PathBuf> {
    path.iter().map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| {
        let dirs: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
        CniError::new(code::DELEGATE_FAILED, format!("failed to find plugin {name:?} in path [{}]", dirs.join(" ")))
    })
}

impl Delegate for ExecDelegate {
    fn run(&mut self, plugin: &str, command: Command, inv: &Invocation, stdin: &[u8]) -> Result<Vec<u8>> {
        use std::io::Write;
        let bin = find_plugin(plugin, &inv.path)?;
        let mut c = Process::new(&bin);
        // The delegate gets the same environment, with the command we are running it for.
        c.env("CNI_COMMAND", command.as_str()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = c
            .spawn()
            .map_err(|e| CniError::new(code::DELEGATE_FAILED, format!("cannot run {}: {e}", bin.display())))?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(stdin)
            .map_err(|e| CniError::new(code::DELEGATE_FAILED, format!("cannot write to {plugin}: {e}")))?;
        let out = child
            .wait_with_output()
            .map_err(|e| CniError::new(code::DELEGATE_FAILED, format!("{plugin} failed: {e}")))?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let err: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        Err(CniError::new(
            err.get("code").and_then(Value::as_u64).map(|c| c as u32).unwrap_or(code::DELEGATE_FAILED),
            format!(
                "{plugin}: {}",
                err.get("msg").and_then(Value::as_str).unwrap_or("failed without an error message")
            ),
        )
        .with_details(err.get("details").and_then(Value::as_str).unwrap_or("").to_string()))
    }
}

/// Something ADD created, to undo on failure (in reverse order).
enum Undo {
    HostLink(String),
    Ipam,
    Masq(String),
}

fn netns_of(inv: &Invocation) -> Result<&Path> {
    inv.netns.as_deref().ok_or_else(|| CniError::new(code::INVALID_ENV, "required env variable CNI_NETNS missing"))
}

/// ADD: bridge, veth, IPAM, addresses/routes, gateway, NAT; the result in `version`'s format.
pub fn add(
    dp: &mut dyn Dataplane,
    ipam: &mut dyn Delegate,
    inv: &Invocation,
    conf: &Value,
    stdin: &[u8],
    version: &str,
) -> Result<Value> {
    let cfg = BridgeConfig::from_netconf(conf)?;
    let netns = netns_of(inv)?;
    if !netns.exists() {
        return Err(CniError::new(code::INTERNAL, format!("failed to open netns {}: no such file", netns.display())));
    }
    if dp.container_link(netns, &inv.ifname)?.is_some() {
        return Err(CniError::new(
            code::DUPLICATE_ATTACHMENT,
            format!("container interface {} already exists in {}", inv.ifname, netns.display()),
        ));
    }
    let mut undo: Vec<Undo> = Vec::new();
    let outcome = add_steps(dp, ipam, inv, stdin, &cfg, netns, &mut undo);
    match outcome {
        Ok(result) => Ok(result.to_json(version)),
        Err(e) => {
            let mut cleanup_errors = Vec::new();
            for step in undo.into_iter().rev() {
                let r = match step {
                    Undo::HostLink(name) => dp.delete_host_link(&name),
                    Undo::Ipam => ipam.run(&cfg.ipam_type, Command::Del, inv, stdin).map(|_| ()),
                    Undo::Masq(chain) => dp.teardown_masq(&chain, "", &[]),
                };
                if let Err(c) = r {
                    cleanup_errors.push(c.to_string());
                }
            }
            // Keep both the failure and whatever its cleanup hit.
            if cleanup_errors.is_empty() {
                Err(e)
            } else {
                let details = format!("{}; cleanup also failed: {}", e.details, cleanup_errors.join("; "));
                Err(e.with_details(details.trim_start_matches("; ").to_string()))
            }
        }
    }
}

fn add_steps(
    dp: &mut dyn Dataplane,
    ipam: &mut dyn Delegate,
    inv: &Invocation,
    stdin: &[u8],
    cfg: &BridgeConfig,
    netns: &Path,
    undo: &mut Vec<Undo>,
) -> Result<CniResult> {
    let bridge = dp.ensure_bridge(&cfg.bridge, cfg.mtu, cfg.promisc_mode)?;
    let host_name = host_veth_name(&inv.container_id, &inv.ifname);
    // The veth pair goes with its host end.
    undo.push(Undo::HostLink(host_name.clone()));
    let (host, container) = dp.create_veth(&host_name, netns, &inv.ifname, cfg.mtu, &bridge, cfg.hairpin_mode)?;
    undo.push(Undo::Ipam);
    let out = ipam.run(&cfg.ipam_type, Command::Add, inv, stdin)?;
    let ipam_json: Value = serde_json::from_slice(&out).map_err(|e| {
        CniError::new(code::DECODE, format!("cannot decode the result of {}", cfg.ipam_type))
            .with_details(e.to_string())
    })?;
    let mut result = CniResult::from_json(&ipam_json)?;
    if result.ips.is_empty() {
        return Err(CniError::new(code::DELEGATE_FAILED, format!("{} returned no IP addresses", cfg.ipam_type)));
    }
    let mut routes = result.routes.clone();
    if cfg.is_default_gateway {
        for ip in &result.ips {
            let default: ipnet::IpNet = if ip.address.addr().is_ipv4() {
                "0.0.0.0/0".parse().expect("valid")
            } else {
                "::/0".parse().expect("valid")
            };
            if !routes.iter().any(|r| r.dst == default) {
                routes.push(Route { dst: default, gw: ip.gateway });
            }
        }
    }
    dp.configure_container(netns, &inv.ifname, &result.ips, &routes)?;
    if cfg.is_gateway {
        for ip in &result.ips {
            if let Some(gw) = ip.gateway {
                let addr = ipnet::IpNet::new(gw, ip.address.prefix_len())
                    .map_err(|e| CniError::new(code::INTERNAL, e.to_string()))?;
                dp.add_bridge_address(&bridge, addr)?;
                dp.enable_ip_forward(gw.is_ipv6())?;
            }
        }
    }
    if cfg.ip_masq {
        let chain = masq_chain(&cfg.name, &inv.container_id);
        undo.push(Undo::Masq(chain.clone()));
        dp.setup_masq(&chain, &masq_comment(&cfg.name, &inv.container_id), &result.ips)?;
    }
    result.interfaces = vec![
        Interface { name: bridge.name.clone(), mac: bridge.mac.clone(), sandbox: None, mtu: cfg.mtu },
        Interface { name: host.name.clone(), mac: host.mac.clone(), sandbox: None, mtu: cfg.mtu },
        Interface {
            name: container.name.clone(),
            mac: container.mac.clone(),
            sandbox: Some(netns.display().to_string()),
            mtu: cfg.mtu,
        },
    ];
    for ip in &mut result.ips {
        ip.interface = Some(2);
    }
    result.routes = routes;
    if result.dns == Default::default() {
        result.dns = cfg.dns.clone();
    }
    Ok(result)
}

/// DEL: container interface (or host veth), NAT, IPAM — each tolerant of "already gone". Runs
/// every step and reports the first failure.
pub fn del(
    dp: &mut dyn Dataplane,
    ipam: &mut dyn Delegate,
    inv: &Invocation,
    conf: &Value,
    stdin: &[u8],
) -> Result<()> {
    let cfg = BridgeConfig::from_netconf(conf)?;
    let mut errors = Vec::new();
    if let Some(netns) = inv.netns.as_deref() {
        if let Err(e) = dp.delete_container_link(netns, &inv.ifname) {
            errors.push(e);
        }
    }
    if let Err(e) = dp.delete_host_link(&host_veth_name(&inv.container_id, &inv.ifname)) {
        errors.push(e);
    }
    // The runtime passes the ADD result on DEL; it names the addresses the NAT rules match.
    let known = conf.get("prevResult").and_then(|p| CniResult::from_json(p).ok()).map(|r| r.ips).unwrap_or_default();
    let comment = masq_comment(&cfg.name, &inv.container_id);
    if let Err(e) = dp.teardown_masq(&masq_chain(&cfg.name, &inv.container_id), &comment, &known) {
        errors.push(e);
    }
    if let Err(e) = ipam.run(&cfg.ipam_type, Command::Del, inv, stdin) {
        errors.push(e);
    }
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// CHECK: the container interface exists with its MAC, and the IPAM reservation holds.
pub fn check(
    dp: &mut dyn Dataplane,
    ipam: &mut dyn Delegate,
    inv: &Invocation,
    conf: &Value,
    stdin: &[u8],
) -> Result<()> {
    let cfg = BridgeConfig::from_netconf(conf)?;
    let prev = conf.get("prevResult").ok_or_else(|| CniError::new(code::INVALID_CONFIG, "CHECK needs prevResult"))?;
    let prev = CniResult::from_json(prev)?;
    let netns = netns_of(inv)?;
    let link = dp.container_link(netns, &inv.ifname)?.ok_or_else(|| {
        CniError::new(
            code::CHECK_FAILED,
            format!("container interface {} is missing from {}", inv.ifname, netns.display()),
        )
    })?;
    if let Some(want) = prev.interfaces.iter().find(|i| i.name == inv.ifname && i.sandbox.is_some()) {
        if !want.mac.is_empty() && !want.mac.eq_ignore_ascii_case(&link.mac) {
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!("{} has MAC {}, prevResult says {}", inv.ifname, link.mac, want.mac),
            ));
        }
    }
    ipam.run(&cfg.ipam_type, Command::Check, inv, stdin).map(|_| ())
}

/// STATUS and GC are the IPAM delegate's (the bridge keeps no other per-network state).
pub fn forward(ipam: &mut dyn Delegate, command: Command, inv: &Invocation, conf: &Value, stdin: &[u8]) -> Result<()> {
    let cfg = BridgeConfig::from_netconf(conf)?;
    ipam.run(&cfg.ipam_type, command, inv, stdin).map(|_| ())
}
