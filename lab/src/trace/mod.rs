//! `podpath trace`: one real request followed hop by hop, rule by rule. The kernel's netfilter
//! trace (a table of its own setting `meta nftrace` on the probe's packets, read back by the
//! trace itself over netlink in a namespace lab's iptables modes, with `nft monitor trace` in
//! the nftables mode, with `xtables-monitor` on a Vagrant lab's VMs) shows every rule the
//! request's first packet hits on every host; conntrack shows each host's NAT of the flow;
//! `ip route get` shows where each host sent it; the API names the objects.
//!
//! [`run`] does the side effects (rules, probe, listeners or monitors, conntrack, API reads);
//! [`events`] and [`parse`] read what the kernel said; [`flow`], [`steps`] and [`assemble`]
//! turn that into a [`model::Trace`] (pure); [`render`] prints it.

pub mod assemble;
pub mod ct;
pub mod dns;
pub mod events;
pub mod flow;
pub mod model;
pub mod nft_steps;
pub mod parse;
pub mod render;
pub mod route;
pub mod run;
pub mod steps;
