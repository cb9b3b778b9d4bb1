//! A hop's conntrack entry for one TCP connection: asked over ctnetlink (`nfnl::Socket::conntrack`)
//! from the trace itself in a namespace lab — no `conntrack -G` program start per connection —
//! and read into the same [`CtEntry`] the tool's text is parsed into (a Vagrant lab's answers).

use std::net::SocketAddr;

use super::parse::CtEntry;

/// The same question as a `conntrack -G` command line (a Vagrant lab's machines are asked so).
pub fn tool_argv((from, to): (SocketAddr, SocketAddr)) -> Vec<String> {
    let mut argv: Vec<String> = ["conntrack", "-G", "-p", "tcp"].map(String::from).to_vec();
    for (flag, value) in [
        ("--orig-src", from.ip().to_string()),
        ("--orig-dst", to.ip().to_string()),
        ("--orig-port-src", from.port().to_string()),
        ("--orig-port-dst", to.port().to_string()),
    ] {
        argv.push(flag.into());
        argv.push(value);
    }
    argv
}

/// The conntrack entry of the TCP connection `from → to` (as its first packet went) in the
/// network namespace `netns` (`/run/netns/NAME`); None when there is none or it cannot be asked.
pub fn get(netns: &str, conn: (SocketAddr, SocketAddr)) -> Option<CtEntry> {
    let path = format!("/run/netns/{netns}");
    let e = crate::in_netns_thread(path, move || super::run::with_nfnl(|s| s.conntrack(conn))).ok()?.ok()??;
    Some(CtEntry { proto: "tcp".into(), state: e.state.into(), assured: e.assured, orig: e.orig, reply: e.reply })
}
