//! The bridge plugin's commands. ADD records an undo step for everything it creates and rolls
//! back on any failure, so a failed ADD leaves nothing behind. DEL is best-effort and works
//! without the netns: names are deterministic, so the host veth and the NAT chain are found
//! without asking the container.

use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use serde_json::Value;

use super::config::{host_veth_name, masq_chain, masq_comment, BridgeConfig};
use super::dataplane::{Dataplane, PortFlags};
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
    let outcome = add_steps(dp, ipam, inv, stdin, &cfg, netns, conf.get("prevResult"), &mut undo);
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

#[allow(clippy::too_many_arguments)]
fn add_steps(
    dp: &mut dyn Dataplane,
    ipam: &mut dyn Delegate,
    inv: &Invocation,
    stdin: &[u8],
    cfg: &BridgeConfig,
    netns: &Path,
    prev: Option<&Value>,
    undo: &mut Vec<Undo>,
) -> Result<CniResult> {
    // IPAM first: a bad IPAM config, an exhausted pool or a missing IPAM plugin then fails
    // before anything in the kernel has changed. (The spec asks for DEL on a failed IPAM ADD.)
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
    let bridge = dp.ensure_bridge(&cfg.bridge, cfg.mtu, cfg.promisc_mode)?;
    let host_name = host_veth_name(&inv.container_id, &inv.ifname);
    // The veth pair goes with its host end.
    undo.push(Undo::HostLink(host_name.clone()));
    let (host, container) = dp.create_veth(
        &host_name,
        netns,
        &inv.ifname,
        cfg.mtu,
        &bridge,
        PortFlags { hairpin: cfg.hairpin_mode, isolated: cfg.route_same_bridge },
    )?;
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
    dp.configure_container(netns, &inv.ifname, &result.ips, &routes, cfg.route_same_bridge)?;
    if cfg.is_gateway {
        for ip in &result.ips {
            if let Some(gw) = ip.gateway {
                let addr = ipnet::IpNet::new(gw, ip.address.prefix_len())
                    .map_err(|e| CniError::new(code::INTERNAL, e.to_string()))?;
                dp.add_bridge_address(&bridge, addr)?;
                dp.enable_ip_forward(gw.is_ipv6())?;
            }
        }
        if cfg.route_same_bridge {
            dp.route_between_ports(&cfg.bridge)?;
        }
    }
    if cfg.ip_masq {
        let chain = masq_chain(&cfg.name, &inv.container_id);
        undo.push(Undo::Masq(chain.clone()));
        dp.setup_masq(&chain, &masq_comment(&cfg.name, &inv.container_id), &result.ips)?;
    }
    // A chained call carries the earlier plugins' result: ours is merged into it.
    let prev = match prev {
        Some(p) => CniResult::from_json(p)?,
        None => CniResult::default(),
    };
    let base = prev.interfaces.len();
    result.interfaces = prev.interfaces.clone();
    result.interfaces.extend([
        Interface { name: bridge.name.clone(), mac: bridge.mac.clone(), sandbox: None, mtu: cfg.mtu },
        Interface { name: host.name.clone(), mac: host.mac.clone(), sandbox: None, mtu: cfg.mtu },
        Interface {
            name: container.name.clone(),
            mac: container.mac.clone(),
            sandbox: Some(netns.display().to_string()),
            mtu: cfg.mtu,
        },
    ]);
    for ip in &mut result.ips {
        ip.interface = Some(base + 2);
    }
    result.ips = prev.ips.into_iter().chain(std::mem::take(&mut result.ips)).collect();
    result.routes = prev.routes.into_iter().chain(routes).collect();
    if result.dns == Default::default() {
        result.dns = if prev.dns == Default::default() { cfg.dns.clone() } else { prev.dns };
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
    let have = dp.container_addresses(netns, &inv.ifname)?;
    for ip in &prev.ips {
        let on_ours = ip.interface.and_then(|i| prev.interfaces.get(i)).is_none_or(|i| i.name == inv.ifname);
        if on_ours && !have.contains(&ip.address) {
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!("address {} is missing from {}", ip.address, inv.ifname),
            ));
        }
    }
    let routes = dp.container_routes(netns)?;
    for r in &prev.routes {
        let gw = r.effective_gw(&prev.ips);
        if !routes.iter().any(|(dst, g)| *dst == r.dst && (gw.is_none() || *g == gw)) {
            return Err(CniError::new(code::CHECK_FAILED, format!("route {} via {gw:?} is missing", r.dst)));
        }
    }
    ipam.run(&cfg.ipam_type, Command::Check, inv, stdin).map(|_| ())
}

/// GC: NAT chains of attachments that are not valid any more go (found by their comments),
/// then the IPAM delegate collects its reservations. Keeps going after errors.
pub fn gc(dp: &mut dyn Dataplane, ipam: &mut dyn Delegate, inv: &Invocation, conf: &Value, stdin: &[u8]) -> Result<()> {
    let cfg = BridgeConfig::from_netconf(conf)?;
    let valid = crate::ipam::valid_attachments(conf)?;
    let mut errors = Vec::new();
    for id in dp.masq_attachments(&cfg.name)? {
        if !valid.iter().any(|(v, _)| *v == id) {
            if let Err(e) = dp.teardown_masq(&masq_chain(&cfg.name, &id), "", &[]) {
                errors.push(e);
            }
        }
    }
    if let Err(e) = ipam.run(&cfg.ipam_type, Command::Gc, inv, stdin) {
        errors.push(e);
    }
    errors.into_iter().next().map_or(Ok(()), Err)
}

/// STATUS is the IPAM delegate's (the bridge itself can always serve ADD).
pub fn forward(ipam: &mut dyn Delegate, command: Command, inv: &Invocation, conf: &Value, stdin: &[u8]) -> Result<()> {
    let cfg = BridgeConfig::from_netconf(conf)?;
    ipam.run(&cfg.ipam_type, command, inv, stdin).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::IpConfig;
    use ipnet::IpNet;
    use serde_json::json;

    use super::super::dataplane::Link;

    /// What the fake dataplane was asked to do.
    #[derive(Debug, Clone, PartialEq)]
    enum Op {
        EnsureBridge(String),
        CreateVeth { host: String, ifname: String, port: PortFlags },
        RouteBetweenPorts(String),
        Configure { ips: Vec<String>, routes: Vec<String> },
        BridgeAddress(String),
        IpForward,
        SetupMasq(String),
        TeardownMasq(String),
        DeleteHost(String),
        DeleteContainer(String),
    }

    #[derive(Default)]
    struct FakeDataplane {
        ops: Vec<Op>,
        /// Name of an op kind to fail ("configure", "masq", "delete-container").
        fail: Option<&'static str>,
        existing_container_link: bool,
        chains_of: Vec<String>,
    }

    fn link(name: &str, index: u32) -> Link {
        Link { index, name: name.into(), mac: format!("02:00:00:00:00:{index:02x}") }
    }

    impl FakeDataplane {
        fn maybe_fail(&self, what: &str) -> Result<()> {
            if self.fail == Some(what) {
                return Err(CniError::new(code::INTERNAL, format!("injected {what} failure")));
            }
            Ok(())
        }
    }

    impl Dataplane for FakeDataplane {
        fn ensure_bridge(&mut self, name: &str, _mtu: Option<u32>, _promisc: bool) -> Result<Link> {
            self.ops.push(Op::EnsureBridge(name.into()));
            Ok(link(name, 1))
        }
        fn container_link(&mut self, _netns: &Path, ifname: &str) -> Result<Option<Link>> {
            Ok(self.existing_container_link.then(|| link(ifname, 3)))
        }
        fn create_veth(
            &mut self,
            host: &str,
            _netns: &Path,
            ifname: &str,
            _mtu: Option<u32>,
            _b: &Link,
            port: PortFlags,
        ) -> Result<(Link, Link)> {
            self.ops.push(Op::CreateVeth { host: host.into(), ifname: ifname.into(), port });
            Ok((link(host, 2), link(ifname, 3)))
        }
        fn configure_container(
            &mut self,
            _netns: &Path,
            _ifname: &str,
            ips: &[IpConfig],
            routes: &[Route],
            _isolated: bool,
        ) -> Result<()> {
            self.maybe_fail("configure")?;
            self.ops.push(Op::Configure {
                ips: ips.iter().map(|i| i.address.to_string()).collect(),
                routes: routes.iter().map(|r| format!("{} via {:?}", r.dst, r.gw)).collect(),
            });
            Ok(())
        }
        fn add_bridge_address(&mut self, _bridge: &Link, addr: IpNet) -> Result<()> {
            self.ops.push(Op::BridgeAddress(addr.to_string()));
            Ok(())
        }
        fn enable_ip_forward(&mut self, _v6: bool) -> Result<()> {
            self.ops.push(Op::IpForward);
            Ok(())
        }
        fn route_between_ports(&mut self, bridge: &str) -> Result<()> {
            self.ops.push(Op::RouteBetweenPorts(bridge.into()));
            Ok(())
        }
        fn setup_masq(&mut self, chain: &str, _comment: &str, _ips: &[IpConfig]) -> Result<()> {
            self.maybe_fail("masq")?;
            self.ops.push(Op::SetupMasq(chain.into()));
            Ok(())
        }
        fn teardown_masq(&mut self, chain: &str, _comment: &str, _known: &[IpConfig]) -> Result<()> {
            self.ops.push(Op::TeardownMasq(chain.into()));
            Ok(())
        }
        fn masq_attachments(&mut self, _network: &str) -> Result<Vec<String>> {
            Ok(self.chains_of.clone())
        }
        fn container_addresses(&mut self, _netns: &Path, _ifname: &str) -> Result<Vec<IpNet>> {
            Ok(vec!["10.1.0.2/24".parse().unwrap()])
        }
        fn container_routes(&mut self, _netns: &Path) -> Result<Vec<(IpNet, Option<std::net::IpAddr>)>> {
            Ok(vec![])
        }
        fn delete_host_link(&mut self, name: &str) -> Result<()> {
            self.ops.push(Op::DeleteHost(name.into()));
            Ok(())
        }
        fn delete_container_link(&mut self, _netns: &Path, ifname: &str) -> Result<()> {
            self.maybe_fail("delete-container")?;
            self.ops.push(Op::DeleteContainer(ifname.into()));
            Ok(())
        }
    }

    /// Answers IPAM calls from a script; records the commands.
    #[derive(Default)]
    struct FakeIpam {
        calls: Vec<Command>,
        fail_add: bool,
    }

    impl Delegate for FakeIpam {
        fn run(&mut self, plugin: &str, command: Command, _inv: &Invocation, _stdin: &[u8]) -> Result<Vec<u8>> {
            assert_eq!(plugin, "podpath-ipam");
            self.calls.push(command);
            if command == Command::Add && self.fail_add {
                return Err(CniError::new(code::POOL_EXHAUSTED, "no IP addresses available"));
            }
            Ok(match command {
                Command::Add => br#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24","gateway":"10.1.0.1"}],"routes":[{"dst":"10.96.0.0/12"}],"dns":{}}"#.to_vec(),
                _ => Vec::new(),
            })
        }
    }

    fn inv() -> Invocation {
        Invocation {
            command: Command::Add,
            container_id: "ctr-1".into(),
            netns: Some(std::env::temp_dir()),
            ifname: "eth0".into(),
            args: vec![],
            path: vec![],
        }
    }

    fn conf() -> Value {
        json!({"cniVersion": "1.0.0", "name": "lab", "type": "podpath-bridge", "bridge": "cni0", "isDefaultGateway": true,
               "ipMasq": true, "dns": {"nameservers": ["10.96.0.10"]}, "ipam": {"type": "podpath-ipam"}})
    }

    #[test]
    fn add_runs_the_steps_in_order_and_builds_the_result() {
        let (mut dp, mut ipam) = (FakeDataplane::default(), FakeIpam::default());
        let out = add(&mut dp, &mut ipam, &inv(), &conf(), b"{}", "1.0.0").unwrap();
        let chain = masq_chain("lab", "ctr-1");
        let veth = host_veth_name("ctr-1", "eth0");
        assert_eq!(
            dp.ops,
            vec![
                Op::EnsureBridge("cni0".into()),
                Op::CreateVeth { host: veth, ifname: "eth0".into(), port: PortFlags::default() },
                Op::Configure {
                    ips: vec!["10.1.0.2/24".into()],
                    routes: vec!["10.96.0.0/12 via None".into(), "0.0.0.0/0 via Some(10.1.0.1)".into()]
                },
                Op::BridgeAddress("10.1.0.1/24".into()),
                Op::IpForward,
                Op::SetupMasq(chain),
            ]
        );
        assert_eq!(ipam.calls, vec![Command::Add]);
        assert_eq!(out["interfaces"].as_array().unwrap().len(), 3);
        assert_eq!(out["interfaces"][2]["sandbox"], std::env::temp_dir().display().to_string());
        assert_eq!(out["ips"][0]["interface"], 2);
        assert_eq!(out["routes"][1]["dst"], "0.0.0.0/0");
        assert_eq!(out["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn route_same_bridge_isolates_the_port_and_lets_the_gateway_route_between_ports() {
        let (mut dp, mut ipam) = (FakeDataplane::default(), FakeIpam::default());
        let mut c = conf();
        c["routeSameBridge"] = json!(true);
        c["hairpinMode"] = json!(true);
        add(&mut dp, &mut ipam, &inv(), &c, b"{}", "1.0.0").unwrap();
        let port = PortFlags { hairpin: true, isolated: true };
        assert!(dp.ops.iter().any(|o| matches!(o, Op::CreateVeth { port: p, .. } if *p == port)), "{:?}", dp.ops);
        let at = |want: &Op| dp.ops.iter().position(|o| o == want).unwrap();
        assert!(at(&Op::RouteBetweenPorts("cni0".into())) > at(&Op::BridgeAddress("10.1.0.1/24".into())));
        // Without a gateway nothing would route between isolated ports: refused before anything.
        let mut c = conf();
        c["routeSameBridge"] = json!(true);
        c["isDefaultGateway"] = json!(false);
        let (mut dp, mut ipam) = (FakeDataplane::default(), FakeIpam::default());
        let err = add(&mut dp, &mut ipam, &inv(), &c, b"{}", "1.0.0").unwrap_err();
        assert_eq!(err.code, code::INVALID_CONFIG);
        assert!(err.msg.contains("routeSameBridge needs isGateway"), "{}", err.msg);
        assert!(dp.ops.is_empty());
    }

    #[test]
    fn a_failed_ipam_add_touches_no_kernel_state_and_calls_ipam_del() {
        let (mut dp, mut ipam) = (FakeDataplane::default(), FakeIpam { fail_add: true, ..Default::default() });
        let err = add(&mut dp, &mut ipam, &inv(), &conf(), b"{}", "1.0.0").unwrap_err();
        assert_eq!(err.code, code::POOL_EXHAUSTED);
        assert!(dp.ops.is_empty(), "{:?}", dp.ops);
        assert_eq!(ipam.calls, vec![Command::Add, Command::Del]);
    }

    #[test]
    fn later_failures_undo_everything_in_reverse() {
        for (fail, want_tail) in [
            ("configure", vec![Op::DeleteHost(host_veth_name("ctr-1", "eth0"))]),
            (
                "masq",
                vec![Op::TeardownMasq(masq_chain("lab", "ctr-1")), Op::DeleteHost(host_veth_name("ctr-1", "eth0"))],
            ),
        ] {
            let (mut dp, mut ipam) = (FakeDataplane { fail: Some(fail), ..Default::default() }, FakeIpam::default());
            assert!(add(&mut dp, &mut ipam, &inv(), &conf(), b"{}", "1.0.0").is_err());
            assert!(dp.ops.ends_with(&want_tail), "{fail}: {:?}", dp.ops);
            assert_eq!(ipam.calls, vec![Command::Add, Command::Del], "{fail}");
        }
    }

    #[test]
    fn duplicate_add_touches_nothing() {
        let (mut dp, mut ipam) =
            (FakeDataplane { existing_container_link: true, ..Default::default() }, FakeIpam::default());
        assert_eq!(
            add(&mut dp, &mut ipam, &inv(), &conf(), b"{}", "1.0.0").unwrap_err().code,
            code::DUPLICATE_ATTACHMENT
        );
        assert!(dp.ops.is_empty() && ipam.calls.is_empty());
    }

    #[test]
    fn chained_add_merges_the_previous_result() {
        let mut c = conf();
        c["prevResult"] = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "lo0", "mac": ""}],
                                 "ips": [{"address": "192.0.2.5/32", "interface": 0}], "dns": {}});
        let out = add(&mut FakeDataplane::default(), &mut FakeIpam::default(), &inv(), &c, b"{}", "1.0.0").unwrap();
        assert_eq!(out["interfaces"].as_array().unwrap().len(), 4);
        assert_eq!(out["ips"][0]["address"], "192.0.2.5/32");
        assert_eq!(out["ips"][1]["interface"], 3);
    }

    #[test]
    fn del_is_best_effort_and_gc_keeps_valid_attachments() {
        let (mut dp, mut ipam) =
            (FakeDataplane { fail: Some("delete-container"), ..Default::default() }, FakeIpam::default());
        let err = del(&mut dp, &mut ipam, &inv(), &conf(), b"{}").unwrap_err();
        assert!(err.msg.contains("injected"));
        assert!(dp.ops.contains(&Op::TeardownMasq(masq_chain("lab", "ctr-1"))));
        assert_eq!(ipam.calls, vec![Command::Del], "IPAM is released even so");
        let mut dp = FakeDataplane { chains_of: vec!["ctr-1".into(), "ctr-gone".into()], ..Default::default() };
        let mut c = conf();
        c["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-1", "ifname": "eth0"}]);
        gc(&mut dp, &mut FakeIpam::default(), &inv(), &c, b"{}").unwrap();
        assert_eq!(dp.ops, vec![Op::TeardownMasq(masq_chain("lab", "ctr-gone"))]);
    }
}
