//! The nftables proxier's sync loop: watch caches → the changed service ports
//! ([`super::tracker`]) → a full sync (the pure
//! renderer [`super::nftables::render`], the whole table replaced in one transaction, or
//! loaded in parts when there is none: [`load_from_nothing`]), then partial
//! syncs made from the changed service ports alone ([`super::nftables::render_changed`]; element
//! commands only go over netlink, [`nfnl`]) → stale chains deleted in a later
//! transaction, at least a second after they were flushed (kube-proxy's rule, for kernels that notice late that no map
//! element points at a chain any more). A table that vanished or a failed transaction makes
//! the next sync a full one, which replaces the table whole.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use podpath_client::reflector::Store;
use podpath_ruleset::nft::{delete_chains, NftFamily, NftTable, Op, Set, Transaction};
use podpath_ruleset::Nft;

use super::iptables::{RenderConfig, ServiceState};
use super::model::{ServiceKey, ServiceView, SliceView};
use super::nftables::{merge_part, render, render_changed, render_head, render_part, NftConfig, Shared, TABLE};
use super::sync::stale_udp_flows;
use super::tracker::Tracker;
use crate::error::{ProxyError, Result};
use crate::health::Health;

/// The chains checked every period: where every packet enters the table's Service handling.
const WATCHED_CHAINS: [&str; 4] = ["services", "nat-prerouting", "nat-output", "masquerading"];

/// Periodic checks in a row that an unchanged nf_tables generation may spare.
const SPARED_CHECKS: u32 = 9;

/// How long a flushed chain waits before it is deleted.
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// What the nftables proxier asks of the kernel.
pub trait NftKernel: Send + Sync + 'static {
    fn apply(&self, tx: &Transaction) -> Result<()>;
    /// A transaction that may hold only element commands, with the declarations of the sets
    /// it names (so that their keys can be encoded): the real kernel sends those over netlink.
    fn apply_elements(&self, tx: &Transaction, _sets: &[Set]) -> Result<()> {
        self.apply(tx)
    }
    /// A full sync: `table` replaces whatever the kernel holds.
    fn apply_full(&self, table: &NftTable) -> Result<()> {
        self.apply(&Transaction::between(None, table).0)
    }
    /// The namespace's nf_tables generation (None: not known here): it moves with every
    /// transaction, so an unchanged one spares the periodic check its listings.
    fn generation(&self) -> Option<u32> {
        None
    }
    /// The rules of one chain of the table, as nft lists them (None: no such chain).
    fn chain_rules(&self, chain: &str) -> Result<Option<Vec<String>>>;
    fn delete_table(&self) -> Result<()>;
    fn clear_conntrack(&self, deletes: &[Vec<String>]);
    /// Whether a full sync now loads the table from nothing (it is not there), in parts that
    /// are written while the next is rendered ([`load_from_nothing`]); false: the whole table
    /// is rendered first and replaces the kernel's in one transaction.
    fn loads_in_parts(&self) -> Result<bool> {
        Ok(false)
    }
    /// Makes a part of a load from nothing ready to write, on the thread that renders them
    /// (`head_sets`: the sets the head declared).
    fn prepare_part(&self, table: NftTable, head_sets: &HeadSets) -> Part {
        Part::new(table, head_sets, None)
    }
    /// Adds a part of a load from nothing to the table in the kernel.
    fn apply_part(&self, part: &Part) -> Result<()> {
        self.apply(&part.transaction())
    }
}

/// A part of a load from nothing ([`render_part`]), ready to write: the table of its service
/// ports (without the elements `encoded` holds), its number of rules and elements.
#[derive(Debug)]
pub struct Part {
    pub table: NftTable,
    pub size: usize,
    /// Its elements as one netlink batch and the batch's number of messages.
    encoded: Option<(Vec<u8>, u32)>,
    /// The sets the head declared (a part declares the others: a service port's own).
    head_sets: HeadSets,
}

/// The names of the sets a load's head declared.
pub type HeadSets = Arc<std::collections::BTreeSet<String>>;

impl Part {
    /// `table` (with its elements, or the skeleton of one whose elements are `encoded`).
    fn new(table: NftTable, head_sets: &HeadSets, encoded: Option<((Vec<u8>, u32), usize)>) -> Part {
        let (rules, elements) = table.size();
        let (encoded, encoded_elements) = match encoded {
            Some((batch, n)) => (Some(batch), n),
            None => (None, 0),
        };
        Part { table, size: rules + elements + encoded_elements, encoded, head_sets: head_sets.clone() }
    }

    /// The transaction adding this part to the table the head made: its chains, rules and
    /// the elements not encoded (its sets' declarations are the head's).
    fn transaction(&self) -> Transaction {
        let mut declared = NftTable::new(self.table.family, &self.table.name);
        declared.comment.clone_from(&self.table.comment);
        declared.sets =
            self.table.sets.iter().filter(|s| self.head_sets.contains(&s.name)).map(Set::declaration).collect();
        Transaction::between(Some(&declared), &self.table).0
    }
}

/// The real kernel: transactions as nf_tables netlink batches ([`nfnl`]) on a socket
/// kept open, in the current network namespace or the one `nft.netns` names; `nft` for the
/// listings, and for a transaction the netlink layer does not write (or every one, with
/// `text_only`: the reference path).
#[derive(Debug, Clone, Default)]
pub struct NftablesKernel {
    pub nft: Nft,
    /// The table's family: `ip kube-proxy`, or `ip6 kube-proxy` for the IPv6 proxier.
    pub family: NftFamily,
    /// Every transaction through `nft -f`, as text.
    pub text_only: bool,
    /// Rules per transaction of a load from nothing (0: [`RULES_PER_PART`]).
    pub rules_per_part: usize,
    socket: Arc<std::sync::Mutex<Option<nfnl::Socket>>>,
    /// The declarations of the table's sets as last written (to encode elements of sets a
    /// transaction names without declaring them).
    sets: Arc<std::sync::Mutex<BTreeMap<String, Set>>>,
    /// Transactions that went through `nft -f`.
    nft_runs: Arc<std::sync::atomic::AtomicU64>,
}

fn network(source: podpath_ruleset::RulesetError) -> ProxyError {
    ProxyError::Rules { what: "nftables".into(), source }
}

impl NftablesKernel {
    /// The text path only (`nft -f`), in `nft`'s namespace.
    pub fn text(nft: Nft) -> Self {
        NftablesKernel { nft, text_only: true, ..Default::default() }
    }

    /// The netlink path first, in `nft`'s namespace.
    pub fn in_netns(nft: Nft) -> Self {
        NftablesKernel { nft, ..Default::default() }
    }

    /// The kernel of the proxier of one family (`ip kube-proxy` or `ip6 kube-proxy`), over
    /// netlink.
    pub fn for_family(family: NftFamily) -> Self {
        NftablesKernel { family, ..Default::default() }
    }

    /// How many transactions went through `nft -f`.
    pub fn nft_runs(&self) -> u64 {
        self.nft_runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on the open socket (opening it first); a socket that failed is dropped, as it
    /// may still hold replies to the failed batch.
    fn with_socket<T>(&self, f: impl FnOnce(&mut nfnl::Socket) -> nfnl::Result<T>) -> Result<T> {
        let mut socket = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        if socket.is_none() {
            *socket = Some(nfnl::Socket::open_in(self.nft.netns.as_deref())?);
        }
        let r = f(socket.as_mut().expect("opened")).map_err(ProxyError::from);
        if r.is_err() {
            *socket = None;
        }
        r
    }

    /// Keeps the declarations a successful transaction made or removed.
    fn remember(&self, tx: &Transaction) {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        for op in &tx.ops {
            match op {
                Op::DeleteTable => sets.clear(),
                Op::AddSet(s) => {
                    sets.insert(s.name.clone(), s.declaration());
                }
                Op::DeleteSet(name, _) => {
                    sets.remove(name);
                }
                _ => {}
            }
        }
    }

    /// `tx` over netlink (with `known` declarations, else the remembered ones), or through
    /// `nft -f` when the netlink layer does not write it.
    fn apply_with(&self, tx: &Transaction, known: Option<&[Set]>) -> Result<()> {
        if tx.is_empty() {
            return Ok(());
        }
        let sent = !self.text_only && {
            let remembered: Vec<Set>;
            let sets = match known {
                Some(s) => s,
                None => {
                    remembered = self.sets.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
                    &remembered
                }
            };
            self.with_socket(|s| s.apply(tx, sets))?
        };
        if !sent {
            if !self.text_only {
                tracing::debug!(
                    "nftables: a transaction the netlink layer does not write goes to nft -f:\n{}",
                    tx.text()
                );
            }
            self.nft_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.nft.apply(tx).map_err(network)?;
        }
        self.remember(tx);
        Ok(())
    }
}

impl NftKernel for NftablesKernel {
    fn apply(&self, tx: &Transaction) -> Result<()> {
        self.apply_with(tx, None)
    }
    fn apply_full(&self, table: &NftTable) -> Result<()> {
        // A table that is there is replaced in one transaction, so that its Services never go
        // dark meanwhile. One loaded from nothing goes in several (nothing is lost while it is
        // loading): the kernel binds each anonymous set by walking its whole transaction, so one
        // transaction of 10,000 Services in kube-proxy's layouts costs it tens of seconds.
        if self.text_only || self.with_socket(|s| s.has_table(self.family, TABLE))? {
            return self.apply_with(&Transaction::between(None, table).0, Some(&[]));
        }
        // Declarations and rules in parts, then the elements (nearly all of a shared-maps
        // table) in one batch encoded from the table itself, not copied into commands first.
        let per_part = if self.rules_per_part == 0 { RULES_PER_PART } else { self.rules_per_part };
        let skeleton = nfnl::skeleton(table);
        let mut loaded = load_in_parts(Transaction::between(None, &skeleton).0, per_part)
            .iter()
            .try_for_each(|part| self.apply_with(part, Some(&table.sets)));
        if loaded.is_ok() {
            loaded = self.with_socket(|s| s.add_elements(table));
        }
        if loaded.is_err() {
            // Half a table must not stay: the next full sync starts from nothing again.
            let _ = self.delete_table();
        }
        loaded
    }
    fn apply_elements(&self, tx: &Transaction, sets: &[Set]) -> Result<()> {
        self.apply_with(tx, Some(sets))
    }
    fn generation(&self) -> Option<u32> {
        if self.text_only {
            return None;
        }
        self.with_socket(|s| s.generation()).ok()
    }
    fn chain_rules(&self, chain: &str) -> Result<Option<Vec<String>>> {
        self.nft.chain_rules(self.family, TABLE, chain).map_err(network)
    }
    fn delete_table(&self) -> Result<()> {
        self.nft.delete_table(self.family, TABLE).map_err(network)
    }
    fn clear_conntrack(&self, deletes: &[Vec<String>]) {
        podpath_ruleset::kernel::conntrack_delete(deletes)
    }
    fn loads_in_parts(&self) -> Result<bool> {
        Ok(!self.text_only && !self.with_socket(|s| s.has_table(self.family, TABLE))?)
    }
    fn prepare_part(&self, table: NftTable, head_sets: &HeadSets) -> Part {
        // The elements encoded here, beside the rendering; the kernel's thread only sends them.
        // (No anonymous set is named after the batch's sequence numbers: 0 will do.)
        let skeleton = nfnl::skeleton(&table);
        let encoded = nfnl::encode_elements(&table, 0).map(|batch| (batch, table.size().1 - skeleton.size().1));
        Part::new(skeleton, head_sets, encoded)
    }
    fn apply_part(&self, part: &Part) -> Result<()> {
        let per_part = if self.rules_per_part == 0 { RULES_PER_PART } else { self.rules_per_part };
        for tx in load_in_parts(part.transaction(), per_part) {
            self.apply_with(&tx, Some(&part.table.sets))?;
        }
        match &part.encoded {
            Some((batch, n)) => self.with_socket(|s| s.send(batch, *n, 0)),
            None => Ok(()),
        }
    }
}

/// Rules per transaction of a load from nothing (with the anonymous sets they declare).
pub const RULES_PER_PART: usize = 500;

/// A load from nothing (`Transaction::between(None, …)`) cut into transactions that each hold at
/// most `rules` rules: declarations first, then the rules chain by chain, the elements last,
/// each part naming only what an earlier one (or itself) declared.
pub fn load_in_parts(tx: Transaction, rules: usize) -> Vec<Transaction> {
    let Transaction { family, table, comment, ops } = tx;
    let empty = || Transaction { family, table: table.clone(), comment: comment.clone(), ops: vec![] };
    let mut parts = vec![];
    let mut part = empty();
    let mut in_part = 0;
    for op in ops {
        if matches!(op, Op::AddRule { .. }) {
            if in_part == rules {
                parts.push(std::mem::replace(&mut part, empty()));
                in_part = 0;
            }
            in_part += 1;
        }
        part.ops.push(op);
    }
    parts.push(part);
    parts
}

impl<K: NftKernel> NftKernel for Arc<K> {
    fn apply(&self, tx: &Transaction) -> Result<()> {
        (**self).apply(tx)
    }
    fn apply_elements(&self, tx: &Transaction, sets: &[Set]) -> Result<()> {
        (**self).apply_elements(tx, sets)
    }
    fn apply_full(&self, table: &NftTable) -> Result<()> {
        (**self).apply_full(table)
    }
    fn generation(&self) -> Option<u32> {
        (**self).generation()
    }
    fn chain_rules(&self, chain: &str) -> Result<Option<Vec<String>>> {
        (**self).chain_rules(chain)
    }
    fn delete_table(&self) -> Result<()> {
        (**self).delete_table()
    }
    fn clear_conntrack(&self, deletes: &[Vec<String>]) {
        (**self).clear_conntrack(deletes)
    }
    fn loads_in_parts(&self) -> Result<bool> {
        (**self).loads_in_parts()
    }
    fn prepare_part(&self, table: NftTable, head_sets: &HeadSets) -> Part {
        (**self).prepare_part(table, head_sets)
    }
    fn apply_part(&self, part: &Part) -> Result<()> {
        (**self).apply_part(part)
    }
}

/// Removes the nftables mode's table (`--cleanup`, and a start in another mode); true when
/// there was one. Without `nft` installed there is nothing of ours to remove.
pub fn cleanup_nftables() -> bool {
    let nft = Nft::default();
    let mut removed = false;
    for family in [NftFamily::Ip, NftFamily::Ip6] {
        if let Ok(true) = nft.has_table(family, TABLE) {
            match nft.delete_table(family, TABLE) {
                Ok(()) => removed = true,
                Err(e) => tracing::warn!("cannot delete the nftables table {} {TABLE}: {e}", family.name()),
            }
        }
    }
    removed
}

/// The nftables proxier's inputs.
pub struct NftProxier<K> {
    pub kernel: Arc<K>,
    pub render: RenderConfig,
    pub nft: NftConfig,
    pub services: Arc<Store<ServiceView>>,
    pub slices: Arc<Store<SliceView>>,
    pub health: Arc<Health>,
    /// At most this long between checks of the table (a changed or vanished table gets a full sync).
    pub period: Duration,
    /// Minimum time between syncs (kube-proxy's minSyncPeriod).
    pub min_interval: Duration,
    pub health_check_bind: Option<std::net::IpAddr>,
}

/// Chains flushed by a sync, deleted once `due`.
struct Stale {
    due: tokio::time::Instant,
    chains: Vec<String>,
}

/// A full sync: the render of `state` replaces whatever the table holds, in one transaction
/// (or, when there is no table, is loaded in parts: [`load_from_nothing`]). Returns the new
/// table (without its elements: `forget_elements`) and its number of rules and elements.
pub fn sync_full<K: NftKernel + ?Sized>(
    k: &K,
    cfg: &RenderConfig,
    nft: &NftConfig,
    state: &[ServiceState],
) -> Result<(NftTable, usize)> {
    if k.loads_in_parts()? {
        return load_from_nothing(k, cfg, nft, state);
    }
    let mut next = render(cfg, nft, state);
    k.apply_full(&next)?;
    let (rules, elements) = next.size();
    forget_elements(&mut next);
    Ok((next, rules + elements))
}

/// Service ports per part of a load from nothing.
pub const PORTS_PER_PART: usize = 500;

/// A full sync into a kernel without the table: its head (fixed chains and sets, shared DNAT
/// chains) first, then the service ports [`PORTS_PER_PART`] at a time, each part rendered and
/// encoded on a thread of its own while the kernel takes the one before (at 10,000 Services
/// the render costs more than half of what the kernel does). Nothing was there, so nothing
/// is lost meanwhile; a failure deletes the half-loaded table, as [`NftKernel::apply_full`]
/// does.
pub fn load_from_nothing<K: NftKernel + ?Sized>(
    k: &K,
    cfg: &RenderConfig,
    nft: &NftConfig,
    state: &[ServiceState],
) -> Result<(NftTable, usize)> {
    let mut table = render_head(cfg, nft, state);
    let (rules, elements) = table.size();
    let loaded = std::thread::scope(|s| {
        let (to_kernel, parts) = std::sync::mpsc::sync_channel::<Part>(2);
        let mut written = Written::of(&table);
        let head_sets: HeadSets = Arc::new(table.sets.iter().map(|s| s.name.clone()).collect());
        s.spawn(move || {
            for ports in state.chunks(PORTS_PER_PART) {
                let mut table = render_part(cfg, nft, ports);
                written.keep_new(&mut table);
                let part = k.prepare_part(table, &head_sets);
                // A send fails once the kernel's side stopped at an error.
                if to_kernel.send(part).is_err() {
                    break;
                }
            }
        });
        k.apply_full(&table)?;
        let mut size = rules + elements;
        for part in parts {
            k.apply_part(&part)?;
            size += part.size;
            merge_part(&mut table, part.table);
        }
        Ok(size)
    });
    match loaded {
        Ok(size) => {
            forget_elements(&mut table);
            Ok((table, size))
        }
        Err(e) => {
            let _ = k.delete_table();
            Err(e)
        }
    }
}

/// The keys of the elements a load in parts wrote so far, by set.
struct Written(std::collections::HashMap<String, std::collections::HashSet<String, foldhash::fast::RandomState>>);

impl Written {
    fn of(head: &NftTable) -> Written {
        Written(head.sets.iter().map(|s| (s.name.clone(), s.elements.keys().cloned().collect())).collect())
    }

    /// Drops from `part` its elements of keys written before (two service ports on one
    /// address and port, which the API allows for external IPs: the first one keeps the key,
    /// as in the table rendered whole), and notes its other keys as written.
    fn keep_new(&mut self, part: &mut NftTable) {
        for s in &mut part.sets {
            let keys = self.0.entry(s.name.clone()).or_default();
            s.elements.retain(|k, _| keys.insert(k.clone()));
        }
    }
}

/// A sync of the service ports that changed (`old` states → `new` ones; a port only in `new`
/// was created, only in `old` deleted), built from their own elements and chains so that its
/// cost does not grow with the table: `table` (what the kernel held) and `shared` are brought
/// up to date. Returns the chains flushed (to delete later) and the number of commands.
pub fn sync_changed<K: NftKernel + ?Sized>(
    k: &K,
    cfg: &RenderConfig,
    nft: &NftConfig,
    shared: &mut Shared,
    table: &mut NftTable,
    old: &[ServiceState],
    new: &[ServiceState],
) -> Result<(Vec<String>, usize)> {
    let (old, new): (Vec<&ServiceState>, Vec<&ServiceState>) = (old.iter().collect(), new.iter().collect());
    let (before, after) = render_changed(cfg, nft, shared, &old, &new);
    let (tx, stale) = Transaction::between(Some(&before), &after);
    let ops = tx.len();
    k.apply_elements(&tx, &after.sets)?;
    table.replace_part(&before, &after);
    forget_elements(table);
    Ok((stale, ops))
}

/// What the proxier keeps of a table it wrote: chains and set declarations. Partial syncs are
/// made from the changed ports' own elements, so the elements in the kernel need no copy here
/// (at 10,000 × 10 in shared-maps, 190,000 of them: ≈ 90 MiB).
fn forget_elements(table: &mut NftTable) {
    for s in &mut table.sets {
        s.elements = Default::default();
    }
}

/// Runs the proxier: a full sync first, then a sync after every change (at most one per
/// `min_interval`), stale chains deleted when due, the table's dispatching chains checked every few seconds.
pub async fn run_nft_proxier<K: NftKernel>(p: NftProxier<K>, synced: Option<tokio::sync::oneshot::Sender<()>>) {
    let NftProxier { kernel, render: cfg, nft, services, slices, health, period, min_interval, health_check_bind } = p;
    let mut health_servers = health_check_bind.map(|b| super::service_health::HealthServers::new(b, health.clone()));
    services.wait_synced().await;
    slices.wait_synced().await;
    let mut synced = synced;
    let mut svc_changes = services.changes();
    let mut slice_changes = slices.changes();
    let mut last: Option<NftTable> = None;
    // The service ports, updated per changed object (an event's cost does not grow with the
    // number of Services).
    let mut tracker = Tracker::new(&cfg.node_name);
    let mut shared = Shared::default();
    let mut stale: Vec<Stale> = vec![];
    // conntrack deletions owed to UDP ports that gained endpoints (kept until a sync lands).
    let mut udp: Vec<Vec<String>> = vec![];
    let mut resync = true;
    // The nf_tables generation after our last write, how many periodic checks it spared, and
    // whether it moved without us since the last check (then the next check runs).
    let mut ours: Option<u32> = None;
    let mut spared = 0;
    let mut foreign = false;
    loop {
        super::stall::hold().await;
        if resync {
            let started = tokio::time::Instant::now();
            let delta = tracker.update(&services, &slices);
            let was: BTreeMap<ServiceKey, ServiceState> =
                delta.old.iter().map(|st| (st.port.key(), st.clone())).collect();
            udp.extend(stale_udp_flows(&was, &delta.new));
            drop(was);
            let full = last.is_none();
            if !full && delta.is_empty() {
                // Nothing of ours changed (an object the ports do not read, or a change undone).
                health.updated();
                resync = false;
                continue;
            }
            // For the debug line below: which Services this sync wrote (timing breakdowns read it).
            let changed_names = tracing::enabled!(tracing::Level::DEBUG)
                .then(|| super::model::names_summary(delta.new.iter().map(|st| st.port.key().name.to_string())));
            let checks = super::service_health::wanted(tracker.states(), &cfg.node_name);
            let (k, c, n, prev) = (kernel.clone(), cfg.clone(), nft.clone(), last.take());
            // A full sync renders every port; a partial one only the ports that changed.
            let state = if full { tracker.list() } else { vec![] };
            let udp_now = udp.clone();
            let mut sharing = std::mem::take(&mut shared);
            let result = tokio::task::spawn_blocking(move || {
                let before = k.generation();
                let r = match prev {
                    None => sync_full(&*k, &c, &n, &state).map(|(table, ops)| {
                        sharing = Shared::of(&c, &n, &state);
                        (table, vec![], ops)
                    }),
                    Some(mut table) => sync_changed(&*k, &c, &n, &mut sharing, &mut table, &delta.old, &delta.new)
                        .map(|(flushed, ops)| (table, flushed, ops)),
                };
                if r.is_ok() {
                    k.clear_conntrack(&udp_now);
                }
                r.map(|r| (r, sharing, (before, k.generation())))
            })
            .await
            .unwrap_or_else(|e| Err(ProxyError::Task(format!("sync task failed: {e}"))));
            match result {
                Ok(((table, flushed, ops), sharing, (before, after))) => {
                    // Somebody wrote since our last write: our write must not hide it.
                    foreign |= before != ours;
                    ours = after;
                    shared = sharing;
                    last = Some(table);
                    udp.clear();
                    if !flushed.is_empty() {
                        stale.push(Stale { due: tokio::time::Instant::now() + STALE_CHAIN_DELAY, chains: flushed });
                    }
                    health.updated();
                    health.metrics.synced(full, started.elapsed());
                    if let Some(servers) = health_servers.as_mut() {
                        servers.sync(checks).await;
                    }
                    tracing::debug!(
                        took_ms = started.elapsed().as_millis() as u64,
                        full,
                        ops,
                        services = changed_names.as_deref().unwrap_or(""),
                        "nftables synced"
                    );
                    if let Some(tx) = synced.take() {
                        let _ = tx.send(());
                    }
                }
                Err(e) => {
                    tracing::warn!("nftables sync failed (retrying with a full sync): {e}");
                    health.metrics.sync_error("nftables");
                    // `last` stays None: the next sync replaces the table.
                    stale.clear();
                }
            }
            if full {
                // A full sync's buffers (the render, the batch, the delta) are freed by now:
                // give them back rather than keep them as resident memory.
                podpath_client::memory::trim();
            }
            resync = false;
        }
        let next_due = stale.iter().map(|s| s.due).min();
        let wait = if last.is_none() { Duration::from_secs(1) } else { period.min(super::sync::VERIFY_PERIOD) };
        tokio::select! {
            r = svc_changes.changed() => { if r.is_err() { return; } health.queued(); resync = true; }
            r = slice_changes.changed() => { if r.is_err() { return; } health.queued(); resync = true; }
            _ = async { tokio::time::sleep_until(next_due.expect("guarded")).await }, if next_due.is_some() => {
                let now = tokio::time::Instant::now();
                let (due, later): (Vec<Stale>, Vec<Stale>) = stale.drain(..).partition(|s| s.due <= now);
                stale = later;
                // A chain that came back meanwhile (its Service re-created) stays.
                let chains: Vec<String> = due
                    .into_iter()
                    .flat_map(|s| s.chains)
                    .filter(|c| last.as_ref().is_some_and(|t| t.chain(c).is_none()))
                    .collect();
                if !chains.is_empty() {
                    let k = kernel.clone();
                    let family = if cfg.ipv6() { NftFamily::Ip6 } else { NftFamily::Ip };
                    let tx = delete_chains(family, TABLE, &chains);
                    let r = tokio::task::spawn_blocking(move || {
                        let before = k.generation();
                        k.apply(&tx).map(|()| (before, k.generation()))
                    })
                    .await;
                    if let Ok(Ok((before, after))) = r {
                        foreign |= before != ours;
                        ours = after;
                    } else {
                        tracing::warn!(chains = chains.len(), "deleting stale nftables chains failed; a full sync follows");
                        last = None;
                        resync = true;
                    }
                }
            }
            _ = tokio::time::sleep(wait) => {
                // kube-proxy's canary, nftables style, and more: a deleted table, or the
                // dispatching chains emptied or edited (`nft flush table`, a rule deleted or
                // inserted), gets the table rewritten whole. Two small chains are read: the
                // same cost at any table size. Before that, the namespace's nf_tables
                // generation: while it is the one our last write left, nobody has changed any
                // ruleset here and the listings (an `nft` run each, ≈100 ms at 10,000
                // Services) are spared — up to SPARED_CHECKS times in a row, since a change
                // made between our reading of the generation and our write would pass for ours.
                let k = kernel.clone();
                let now = tokio::task::spawn_blocking(move || k.generation()).await.ok().flatten();
                if last.is_some() && now.is_some() && now == ours && !foreign && spared < SPARED_CHECKS {
                    spared += 1;
                    continue;
                }
                spared = 0;
                foreign = false;
                let k = kernel.clone();
                let want: Vec<(String, Vec<String>)> = last
                    .as_ref()
                    .map(|t| {
                        WATCHED_CHAINS
                            .iter()
                            .filter_map(|c| t.chain(c))
                            .map(|c| (c.name.clone(), c.rules.iter().map(|r| podpath_ruleset::nft::listed(r)).collect()))
                            .collect()
                    })
                    .unwrap_or_default();
                let found = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
                    let mut out = vec![];
                    for (chain, rules) in &want {
                        match k.chain_rules(chain)? {
                            None => out.push(format!("chain {chain} is gone")),
                            Some(held) if held.len() != rules.len() => {
                                out.push(format!("chain {chain} holds {} rules where {} were written", held.len(), rules.len()))
                            }
                            Some(_) => {}
                        }
                    }
                    Ok(out)
                })
                .await;
                let drift = match found {
                    Ok(Ok(d)) => d,
                    Ok(Err(e)) => vec![e.to_string()],
                    Err(e) => vec![e.to_string()],
                };
                if drift.is_empty() {
                    // Another table changed, or nothing did: ours is as written.
                    ours = now;
                }
                if last.is_none() || !drift.is_empty() {
                    if last.is_some() {
                        tracing::warn!(changes = %drift.join("; "), "the nftables table ip {TABLE} was changed from outside the proxy; rewriting it");
                        health.metrics.rules_repaired("nftables");
                    }
                    last = None;
                    resync = true;
                }
            }
        }
        if resync {
            // Batch what arrives meanwhile (kube-proxy's minSyncPeriod).
            tokio::time::sleep(min_interval).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_in_parts_is_the_same_commands_in_order_each_part_naming_only_what_came_before() {
        let cfg = RenderConfig::new("node-1", "192.168.56.11".parse().unwrap());
        let nft = NftConfig { layout: "v1.34".parse().unwrap(), service_cidrs: vec![] };
        let table = render(&cfg, &nft, &super::super::iptables::tests::services());
        let whole = Transaction::between(None, &table).0;
        let parts = load_in_parts(whole.clone(), 3);
        assert!(parts.len() > 3, "{} parts", parts.len());
        let joined: Vec<Op> = parts.iter().flat_map(|p| p.ops.clone()).collect();
        assert_eq!(joined, whole.ops, "nothing lost, added or reordered");
        for p in &parts {
            assert_eq!((p.family, &p.table, &p.comment), (whole.family, &whole.table, &whole.comment));
            assert!(p.ops.iter().filter(|o| matches!(o, Op::AddRule { .. })).count() <= 3);
        }
        // The table and every declaration come first; elements only after the last rule.
        assert!(matches!(parts[0].ops[..3], [Op::AddTable, Op::DeleteTable, Op::AddTable]));
        let last_rule = joined.iter().rposition(|o| matches!(o, Op::AddRule { .. })).unwrap();
        let first_declaration_after =
            joined.iter().skip(last_rule).position(|o| matches!(o, Op::AddChain(_) | Op::AddSet(_)));
        assert_eq!(first_declaration_after, None);
        assert_eq!(load_in_parts(whole.clone(), 10_000), [whole]);
    }
}
