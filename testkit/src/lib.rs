//! Test helpers shared by podpath's crates: network namespaces with drop guards, the host
//! namespace snapshot tests compare, processes stopped by PID, and benchmark figures as data
//! ([`figures`]).
//!
//! What it is not: part of any component; only tests and benches link it.

pub mod figures;
pub mod iptables;
pub mod netns;
pub mod nft;
pub mod registry;
pub mod token_auth;
