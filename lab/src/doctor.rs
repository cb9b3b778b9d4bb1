//! `podpath doctor`: whether this machine can run a lab, and what to install when it cannot.
//! The checks gather facts ([`gather`]: tools on the PATH, and kernel features tried inside a
//! throwaway network namespace of a child process, so the host's own is never touched); the
//! verdict and its text are pure ([`report`]).

use std::process::{Command, Stdio};

/// One thing the lab needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub what: String,
    pub ok: bool,
    /// What to do when it is not ok (a Debian package to install, a module to load …).
    pub fix: String,
    /// Needed for `podpath up`; otherwise only for some commands (named in `what`).
    pub required: bool,
}

/// The tools the lab runs and the Debian packages that bring them.
pub const TOOLS: [(&str, &str, bool); 11] = [
    ("ip", "apt-get install iproute2", true),
    ("sysctl", "apt-get install procps", true),
    ("iptables", "apt-get install iptables", true),
    ("iptables-save", "apt-get install iptables", true),
    ("iptables-restore", "apt-get install iptables", true),
    ("nsenter", "apt-get install util-linux", true),
    ("curl", "apt-get install curl (podpath curl and the lab's probes)", true),
    ("crun", "apt-get install crun (the OCI runtime that runs containers of images)", true),
    ("conntrack", "apt-get install conntrack (podpath trace)", false),
    ("nft", "apt-get install nftables (podpath up --proxy-mode nftables)", false),
    (
        "kubectl",
        "run scripts/install-kubectl, or install kubectl 1.30 or later \
         (https://kubernetes.io/docs/tasks/tools/); Debian's kubernetes-client is 1.20",
        false,
    ),
];

/// What a throwaway network namespace showed: (feature, worked, how to fix it).
pub type KernelFacts = Vec<(String, bool, String)>;

/// Whether `tool` is an executable file on the PATH.
pub(crate) fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Runs `script` in a new network namespace of a child process (`unshare --net`), which the
/// kernel removes when the child ends.
fn in_throwaway_netns(script: &str) -> bool {
    Command::new("unshare")
        .args(["--net", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Looks at this machine.
pub fn gather() -> (bool, Vec<(String, bool)>, KernelFacts) {
    let root = nix::unistd::geteuid().is_root();
    let tools = TOOLS.iter().map(|(t, _, _)| (t.to_string(), on_path(t))).collect();
    let mut kernel = Vec::new();
    if root && on_path("unshare") && on_path("ip") && on_path("sysctl") {
        let probes = [
            ("network namespaces", "true", "a kernel with CONFIG_NET_NS"),
            ("veth pairs", "ip link add pp0 type veth peer name pp1", "modprobe veth"),
            ("bridges", "ip link add ppbr type bridge", "modprobe bridge"),
            (
                "iptables nat table",
                "iptables -t nat -S >/dev/null",
                "modprobe iptable_nat (or nf_tables with iptables-nft)",
            ),
            // The nat table brings conntrack with it (the kernel loads it, as for the lab).
            (
                "conntrack",
                "iptables -t nat -S >/dev/null && test -e /proc/sys/net/netfilter/nf_conntrack_max",
                "modprobe nf_conntrack",
            ),
            ("IP forwarding", "sysctl -qw net.ipv4.ip_forward=1", "a kernel that lets a namespace forward"),
            // Containers of images stack their layers with overlayfs (mounted in a throwaway
            // mount namespace here, on a throwaway directory).
            (
                "overlayfs",
                "d=$(mktemp -d) && mkdir $d/l $d/u $d/w $d/m && unshare -m mount -t overlay o -o lowerdir=$d/l,upperdir=$d/u,workdir=$d/w $d/m; r=$?; rm -rf $d; exit $r",
                "modprobe overlay (containers of images stack their layers with it)",
            ),
        ];
        for (what, script, fix) in probes {
            kernel.push((what.to_string(), in_throwaway_netns(script), fix.to_string()));
        }
    }
    (root, tools, kernel)
}

/// The checks from the facts. Pure.
pub fn checks(root: bool, tools: &[(String, bool)], kernel: &KernelFacts) -> Vec<Check> {
    let mut out = vec![Check {
        what: "root (network namespaces need it)".into(),
        ok: root,
        fix: "run it with sudo".into(),
        required: true,
    }];
    for (tool, found) in tools {
        let (fix, required) =
            TOOLS.iter().find(|(t, _, _)| t == tool).map(|(_, f, r)| (f.to_string(), *r)).unwrap_or_default();
        out.push(Check { what: format!("`{tool}` on the PATH"), ok: *found, fix, required });
    }
    if root {
        for (what, ok, fix) in kernel {
            out.push(Check { what: format!("kernel: {what}"), ok: *ok, fix: fix.clone(), required: true });
        }
    } else {
        out.push(Check {
            what: "kernel features (veth, bridge, iptables nat, conntrack, forwarding, overlayfs)".into(),
            ok: false,
            fix: "run `sudo podpath doctor` to try them".into(),
            required: true,
        });
    }
    out
}

/// The report and whether `podpath up` can work. Pure.
pub fn report(checks: &[Check]) -> (String, bool) {
    let mut s = String::from("podpath doctor: what a lab needs on this machine\n");
    for c in checks {
        let mark = match (c.ok, c.required) {
            (true, _) => "ok     ",
            (false, true) => "MISSING",
            (false, false) => "missing",
        };
        s += &format!("  {mark} {}", c.what);
        if !c.ok {
            s += &format!(" — {}", c.fix);
        }
        s.push('\n');
    }
    let ready = checks.iter().all(|c| c.ok || !c.required);
    s += if ready {
        "ready: `sudo podpath up` can build a lab here\n"
    } else {
        "not ready: install what is MISSING, then run `sudo podpath doctor` again\n"
    };
    (s, ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_name_their_package_and_only_required_ones_block() {
        let tools: Vec<(String, bool)> =
            TOOLS.iter().map(|(t, _, _)| (t.to_string(), *t != "conntrack" && *t != "iptables")).collect();
        let kernel = vec![("veth pairs".to_string(), true, "modprobe veth".to_string())];
        let (text, ready) = report(&checks(true, &tools, &kernel));
        assert!(!ready, "iptables is required");
        assert!(text.contains("MISSING `iptables` on the PATH — apt-get install iptables\n"), "{text}");
        assert!(
            text.contains("missing `conntrack` on the PATH — apt-get install conntrack (podpath trace)\n"),
            "{text}"
        );
        assert!(text.contains("ok      kernel: veth pairs\n"), "{text}");
        let all: Vec<(String, bool)> = TOOLS.iter().map(|(t, _, _)| (t.to_string(), *t != "conntrack")).collect();
        assert!(report(&checks(true, &all, &kernel)).1, "conntrack only matters to trace");
        assert!(!report(&checks(false, &all, &kernel)).1, "not root: cannot tell, not ready");
    }
}
