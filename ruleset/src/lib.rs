//! podpath's ruleset model and everything that reads or writes it:
//!
//! - [`model`]: [`Ruleset`] → [`Table`] (declared chains, then commands) → [`Rule`] (typed
//!   [`Match`]es and a [`Target`]), with builders the renderers use and accessors the readers
//!   use (comment, jump target, probability, DNAT destination…);
//! - [`text`]: the one printer (restore input, kube-proxy's rule text byte for byte) and the one
//!   parser (`iptables-save` output and restore input);
//! - [`plan`]: how much of a ruleset a sync sends and in how many restores (partial syncs,
//!   batches for iptables-nft, stale chains last);
//! - [`lint`]: kube-proxy's structural checks (dangling, empty and unused chains);
//! - [`nft`]: the nftables model of one table, the transaction between two of them and its
//!   `nft -f` text;
//! - [`exec`]: the one place that runs `iptables-save`, `iptables-restore` and `nft`;
//! - [`kernel`]: what a rule writer asks of the kernel's iptables tables, as one small trait
//!   ([`kernel::Kernel`]), and the jumps from built-in chains that a writer keeps in place.
//!
//! Everything but [`exec`] and [`kernel::IptablesKernel`] is pure. The service proxy renders
//! into this model and applies it through [`exec`]; the test fake (`testkit::iptables`) applies
//! it with restore semantics; the lab's `trace`, `explain` and `rules` read the kernel's rules
//! through [`text::parse`].
//!
//! What it is not: a general iptables or nftables library. It models the matches, targets and
//! table forms that kube-proxy, the CNI plugins and the NetworkPolicy printers write (IPv4), and
//! parses back what the kernel lists of them.

pub mod error;
pub mod exec;
pub mod kernel;
pub mod lint;
pub mod model;
pub mod nft;
pub mod plan;
pub mod text;

pub use error::{Result, RulesetError};
pub use exec::{Backend, Family, Iptables, Nft};
pub use model::{Addr, ChainDecl, Command, MarkOp, Match, RecentOp, Rule, Ruleset, Table, Target};
pub use text::parse;
