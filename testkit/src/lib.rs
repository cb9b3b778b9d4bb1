//! Test helpers shared by podpath's crates: network namespaces with drop guards, the host
//! namespace snapshot tests compare, processes stopped by PID, and benchmark figures as data
//! ([`figures`]).

pub mod figures;
pub mod iptables;
pub mod netns;
pub mod nft;
