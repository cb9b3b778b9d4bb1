//! Test helpers shared by podpath's crates: network namespaces with drop guards, the host
//! namespace snapshot tests compare, and processes stopped by PID.

pub mod iptables;
pub mod netns;
