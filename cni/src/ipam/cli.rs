//! `podpath-ipam`: a host-local-compatible CNI IPAM plugin (ADD, DEL, CHECK, STATUS, GC,
//! VERSION; spec 1.1.0). It is run by a CNI runtime or by an interface plugin such as
//! podpath-bridge, never by hand.

use std::io::{Read, Write};

use crate::env::{Command, ProcessEnv};
use crate::error::{code, CniError};
use crate::ipam::{self, IpamConfig};
use crate::types::CniResult;

pub fn main() {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let out = crate::run_plugin(&ProcessEnv, &stdin, &["IP"], |inv, conf, version| {
        read.as_ref().map_err(|e| CniError::new(code::IO, format!("cannot read stdin: {e}")))?;
        let ipam_conf = IpamConfig::from_netconf(conf)?;
        match inv.command {
            Command::Add => Ok(Some(ipam::add(&ipam_conf, inv, conf)?.to_json(version))),
            Command::Del => ipam::del(&ipam_conf, inv).map(|_| None),
            Command::Check => {
                let prev = conf
                    .get("prevResult")
                    .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "CHECK needs prevResult"))
                    .and_then(CniResult::from_json)?;
                ipam::check(&ipam_conf, inv, &prev).map(|_| None)
            }
            Command::Status => ipam::status(&ipam_conf).map(|_| None),
            Command::Gc => {
                let valid = ipam::valid_attachments(conf)?;
                ipam::gc(&ipam_conf, &valid).map(|_| None)
            }
            Command::Version => unreachable!("run_plugin answers VERSION itself"),
        }
    });
    let _ = std::io::stdout().write_all(&out.stdout);
    std::process::exit(out.exit_code);
}
