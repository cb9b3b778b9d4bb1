//! Kinds that CustomResourceDefinitions add at run time: [`Kind::Custom`](crate::Kind) carries a
//! [`CustomKind`], a small index into one table of the process. The table keeps each custom
//! resource's discovery facts as a `&'static` [`KindInfo`], as the built-in kinds have theirs, so
//! the generic code (store keys, errors, selectors, the registry) treats both alike.
//!
//! A custom resource keeps its index for the life of the process (its identity is group and
//! plural: a CRD deleted and made again gets the same one). Its facts are replaced when its CRD
//! changes; each distinct set of facts is made `'static` once (interned), so the memory this
//! takes is bounded by the distinct definitions seen, not by the number of writes.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, RwLock};

use crate::kinds::KindInfo;

/// A custom resource: an index into the process's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CustomKind(u32);

/// A custom resource's facts, as a CRD gives them (owned, before interning).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CustomFacts {
    pub group: String,
    /// The storage version: what objects are kept in.
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub has_status: bool,
    pub has_scale: bool,
    /// The versions served (`served: true`), in the CRD's order.
    pub served: Vec<String>,
    /// Fields of `selectableFields`, as field selectors name them (`spec.color`).
    pub selectable: Vec<String>,
}

/// One row of the table.
struct Entry {
    info: &'static KindInfo,
    /// The facts as served in each served version (only `version` differs).
    versions: &'static [&'static KindInfo],
    /// Served right now (its CRD exists and is established).
    served: &'static [&'static str],
    list_kind: &'static str,
}

#[derive(Default)]
struct Table {
    rows: Vec<Entry>,
    /// `plural.group` → index.
    by_resource: HashMap<String, u32>,
}

fn table() -> &'static RwLock<Table> {
    static T: OnceLock<RwLock<Table>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// Interned facts: each distinct one is leaked once.
fn interned(facts: &CustomFacts) -> (&'static KindInfo, &'static [&'static str], &'static str) {
    type Interned = (&'static KindInfo, &'static [&'static str], &'static str);
    static SEEN: OnceLock<Mutex<HashMap<CustomFacts, Interned>>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = seen.get(facts) {
        return *i;
    }
    let s = |v: &str| -> &'static str { Box::leak(v.to_string().into_boxed_str()) };
    let list = |v: &[String]| -> &'static [&'static str] {
        Box::leak(v.iter().map(|x| s(x)).collect::<Vec<_>>().into_boxed_slice())
    };
    let info: &'static KindInfo = Box::leak(Box::new(KindInfo {
        group: s(&facts.group),
        version: s(&facts.version),
        name: s(&facts.kind),
        plural: s(&facts.plural),
        singular: s(&facts.singular),
        namespaced: facts.namespaced,
        short_names: list(&facts.short_names),
        categories: list(&facts.categories),
        has_status: facts.has_status,
        has_scale: facts.has_scale,
        // Custom resources count spec changes in metadata.generation (everything but
        // metadata and status), as the real server does.
        has_generation: true,
        field_selectors: list(&facts.selectable),
        no_controller: false,
        custom: true,
    }));
    let out = (info, list(&facts.served), s(&facts.list_kind));
    seen.insert(facts.clone(), out);
    out
}

/// A list of interned facts, itself interned (the same list again takes no memory).
fn intern_list(list: Vec<&'static KindInfo>) -> &'static [&'static KindInfo] {
    type Lists = HashMap<Vec<usize>, &'static [&'static KindInfo]>;
    static SEEN: OnceLock<Mutex<Lists>> = OnceLock::new();
    let key: Vec<usize> = list.iter().map(|i| *i as *const KindInfo as usize).collect();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    seen.entry(key).or_insert_with(|| Box::leak(list.into_boxed_slice()))
}

/// How Kubernetes orders versions: GA before beta before alpha, higher numbers first, then
/// others by name. Returns a key that sorts the preferred version first.
pub fn version_priority(v: &str) -> (u8, i64, i64, String) {
    let parse = |rest: &str| -> Option<(u8, i64, i64)> {
        let (major, tail) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len()));
        let major: i64 = major.parse().ok()?;
        if tail.is_empty() {
            return Some((0, -major, 0));
        }
        for (word, rank) in [("beta", 1u8), ("alpha", 2u8)] {
            if let Some(n) = tail.strip_prefix(word) {
                return Some((rank, -major, -n.parse::<i64>().ok()?));
            }
        }
        None
    };
    match v.strip_prefix('v').and_then(parse) {
        Some((rank, major, minor)) => (rank, major, minor, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

impl CustomKind {
    /// Registers (or updates) a custom resource and returns its kind.
    pub fn register(facts: &CustomFacts) -> CustomKind {
        let (info, served, list_kind) = interned(facts);
        let per_version: Vec<&'static KindInfo> =
            facts.served.iter().map(|v| interned(&CustomFacts { version: v.clone(), ..facts.clone() }).0).collect();
        let versions: &'static [&'static KindInfo] = intern_list(per_version);
        let key = format!("{}.{}", facts.plural, facts.group);
        let mut t = table().write().unwrap_or_else(|e| e.into_inner());
        match t.by_resource.get(&key).copied() {
            Some(i) => {
                t.rows[i as usize] = Entry { info, versions, served, list_kind };
                CustomKind(i)
            }
            None => {
                let i = t.rows.len() as u32;
                t.rows.push(Entry { info, versions, served, list_kind });
                t.by_resource.insert(key, i);
                CustomKind(i)
            }
        }
    }

    /// The kind of `plural.group`, registered unserved if it never was (events and keys read
    /// back from the store before the CRDs are loaded).
    pub fn reserve(resource: &str) -> CustomKind {
        if let Some(k) = CustomKind::by_resource(resource) {
            return k;
        }
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        let k = CustomKind::register(&CustomFacts { group: group.into(), plural: plural.into(), ..Default::default() });
        k.unserve();
        k
    }

    /// Stops serving a custom resource (its CRD is gone); its index stays for its events.
    pub fn unserve(self) {
        let mut t = table().write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = t.rows.get_mut(self.0 as usize) {
            e.served = &[];
            e.versions = &[];
        }
    }

    /// The kind of `plural.group` if it was ever registered (served or not). Stored events
    /// and keys of a resource whose CRD is not loaded yet name it so.
    pub fn by_resource(resource: &str) -> Option<CustomKind> {
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        t.by_resource.get(resource).map(|i| CustomKind(*i))
    }

    /// The kind served at `/apis/{group}/{version}/{plural}`, if any.
    pub fn served(group: &str, version: &str, plural: &str) -> Option<CustomKind> {
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        let i = *t.by_resource.get(&format!("{plural}.{group}"))?;
        t.rows[i as usize].served.contains(&version).then_some(CustomKind(i))
    }

    pub fn info(self) -> &'static KindInfo {
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        t.rows.get(self.0 as usize).map(|e| e.info).unwrap_or(&UNKNOWN)
    }

    /// The versions served now, in the CRD's order.
    pub fn served_versions(self) -> &'static [&'static str] {
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        t.rows.get(self.0 as usize).map(|e| e.served).unwrap_or(&[])
    }

    /// The resource's facts in each version served now (discovery lists each).
    pub fn version_infos(self) -> &'static [&'static KindInfo] {
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        t.rows.get(self.0 as usize).map(|e| e.versions).unwrap_or(&[])
    }

    pub fn list_kind(self) -> &'static str {
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        t.rows.get(self.0 as usize).map(|e| e.list_kind).unwrap_or("")
    }

    /// `plural.group`: the resource's name (and its CRD's).
    pub fn resource(self) -> String {
        let i = self.info();
        format!("{}.{}", i.plural, i.group)
    }
}

/// What an index that was never handed out shows (no such index exists: they only come from
/// [`CustomKind::register`]).
static UNKNOWN: KindInfo = KindInfo::core("", "", "");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_preferred_as_kubernetes_orders_them() {
        let mut v = vec!["v1alpha1", "foo", "v1beta1", "v2", "v1", "v1beta2", "v11alpha2"];
        v.sort_by_key(|x| version_priority(x));
        assert_eq!(v, ["v2", "v1", "v1beta2", "v1beta1", "v11alpha2", "v1alpha1", "foo"]);
    }

    fn facts(plural: &str, short: &[&str]) -> CustomFacts {
        CustomFacts {
            group: "stable.example.com".into(),
            version: "v1".into(),
            kind: "CronTab".into(),
            list_kind: "CronTabList".into(),
            plural: plural.into(),
            singular: "crontab".into(),
            namespaced: true,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            served: vec!["v1".into(), "v1beta1".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_resource_keeps_its_kind_across_changes_and_stops_being_served_when_its_crd_goes() {
        let a = CustomKind::register(&facts("crontabs", &["ct"]));
        assert_eq!(a.info().short_names, ["ct"]);
        let b = CustomKind::register(&facts("crontabs", &["ct", "cts"]));
        assert_eq!(a, b);
        assert_eq!(a.info().short_names, ["ct", "cts"]);
        assert_eq!(CustomKind::served("stable.example.com", "v1beta1", "crontabs"), Some(a));
        assert_eq!(CustomKind::served("stable.example.com", "v2", "crontabs"), None);
        assert_eq!(a.resource(), "crontabs.stable.example.com");
        let versions: Vec<&str> = a.version_infos().iter().map(|i| i.version).collect();
        assert_eq!(versions, ["v1", "v1beta1"]);
        a.unserve();
        assert_eq!(CustomKind::served("stable.example.com", "v1", "crontabs"), None);
        assert_eq!(CustomKind::by_resource("crontabs.stable.example.com"), Some(a));
        // The same facts again take no new memory: the interned row is reused.
        let again = interned(&facts("crontabs", &["ct"]));
        assert!(std::ptr::eq(again.0, interned(&facts("crontabs", &["ct"])).0));
    }
}
