//! `podpath-bridge`: a CNI interface plugin (spec 1.1.0) that connects a container to a Linux
//! bridge with a veth pair and delegates addresses to any IPAM plugin (`ipam.type`, found
//! through CNI_PATH). Run by a CNI runtime, never by hand.

use std::io::{Read, Write};

use crate::bridge::dataplane::Netlink;
use crate::bridge::plugin::{self, ExecDelegate};
use crate::env::{Command, ProcessEnv};
use crate::error::{code, CniError};

pub fn main() {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let out = crate::run_plugin(&ProcessEnv, &stdin, &["IP"], |inv, conf, version| {
        read.as_ref().map_err(|e| CniError::new(code::IO, format!("cannot read stdin: {e}")))?;
        let mut ipam = ExecDelegate;
        match inv.command {
            Command::Status => plugin::forward(&mut ipam, inv.command, inv, conf, &stdin).map(|_| None),
            Command::Version => unreachable!("run_plugin answers VERSION itself"),
            command => {
                let mut dp = Netlink::new()?;
                match command {
                    Command::Add => plugin::add(&mut dp, &mut ipam, inv, conf, &stdin, version).map(Some),
                    Command::Del => plugin::del(&mut dp, &mut ipam, inv, conf, &stdin).map(|_| None),
                    Command::Gc => plugin::gc(&mut dp, &mut ipam, inv, conf, &stdin).map(|_| None),
                    _ => plugin::check(&mut dp, &mut ipam, inv, conf, &stdin).map(|_| None),
                }
            }
        }
    });
    let _ = std::io::stdout().write_all(&out.stdout);
    std::process::exit(out.exit_code);
}
