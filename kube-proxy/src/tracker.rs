//! The proxier's view of Services and their endpoints, kept up to date per changed object
//! (kube-proxy's change trackers): after an EndpointSlice changes, only its Service's ports are
//! recomputed and compared, so an event costs the same at 100 Services as at 10,000. Reading
//! the stores is all it does; what the kernel gets is the proxiers' business.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use podpath_client::reflector::{Changed, Store};

use super::iptables::ServiceState;
use super::model::{self, ServiceKey, ServicePortName, ServiceView, SliceView};

/// A Service by namespace and name.
type Owner = (String, String);

/// Every service port's state, and what a sync needs to know of its last update.
#[derive(Default)]
pub struct Tracker {
    node: String,
    /// The stores' generations last read (None: nothing read yet).
    seen: Option<(u64, u64)>,
    /// Each Service's EndpointSlices (keys of the slice store).
    slices_of: HashMap<Owner, BTreeSet<String>>,
    /// Each EndpointSlice's Service, as it was when last read (a deleted slice has no label
    /// left to read).
    owner_of: HashMap<String, Owner>,
    states: BTreeMap<ServiceKey, ServiceState>,
}

/// The service ports an update changed: as they were (`old`) and as they are (`new`); a port
/// created is only in `new`, one deleted only in `old`.
#[derive(Debug, Default, PartialEq)]
pub struct Delta {
    pub old: Vec<ServiceState>,
    pub new: Vec<ServiceState>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.old.is_empty() && self.new.is_empty()
    }
}

fn owner_of_key(key: &str) -> Owner {
    match key.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => ("default".to_string(), key.to_string()),
    }
}

/// The ports of one Service with their endpoints among `slices` (that Service's own).
fn ports(svc: &ServiceView, slices: &[&SliceView], node: &str) -> Vec<ServiceState> {
    svc.ports
        .iter()
        .map(|port| {
            let endpoints = model::endpoints(port, slices.iter().copied(), node);
            ServiceState { port: port.clone(), endpoints }
        })
        .collect()
}

/// Every port of `services` with its endpoints among `slices`, in the services' order: each
/// Service reads only its own slices (grouped first: at 10,000 Services, asking every slice
/// for every port was 10⁸ label comparisons).
pub fn snapshot<'a>(
    services: &[ServiceView],
    slices: impl IntoIterator<Item = &'a SliceView>,
    node: &str,
) -> Vec<ServiceState> {
    let mut grouped: HashMap<&Owner, Vec<&SliceView>> = HashMap::new();
    for s in slices {
        if let Some(o) = &s.service {
            grouped.entry(o).or_default().push(s);
        }
    }
    let mut out = vec![];
    for svc in services {
        // Every port of a Service carries its namespace and name; a Service without ports has
        // nothing for the proxy.
        let Some(first) = svc.ports.first() else { continue };
        let owner = (first.id.namespace.clone(), first.id.name.clone());
        let theirs = grouped.get(&owner).map(Vec::as_slice).unwrap_or(&[]);
        out.extend(ports(svc, theirs, node));
    }
    out
}

impl Tracker {
    pub fn new(node: &str) -> Tracker {
        Tracker { node: node.to_string(), ..Default::default() }
    }

    /// Every service port, in key order.
    pub fn states(&self) -> impl Iterator<Item = &ServiceState> {
        self.states.values()
    }

    pub fn list(&self) -> Vec<ServiceState> {
        self.states.values().cloned().collect()
    }

    pub fn get(&self, key: &ServiceKey) -> Option<&ServiceState> {
        self.states.get(key)
    }

    /// Reads what changed in the stores since the last update and returns the service ports
    /// that differ now. The first update, or one after the stores' logs ran past it, reads
    /// everything (and still returns only the differences).
    pub fn update(&mut self, services: &Store<ServiceView>, slices: &Store<SliceView>) -> Delta {
        let (svc_since, slice_since) = self.seen.unwrap_or((0, 0));
        let (svc_now, svc_changed) = services.changed_since(svc_since);
        let (slice_now, slice_changed) = slices.changed_since(slice_since);
        let first = self.seen.is_none();
        self.seen = Some((svc_now, slice_now));
        match (first, svc_changed, slice_changed) {
            (false, Changed::Keys(svc_keys), Changed::Keys(slice_keys)) => {
                let mut touched: BTreeSet<Owner> = svc_keys.iter().map(|k| owner_of_key(k)).collect();
                for key in slice_keys {
                    let now = slices.get(&key).and_then(|s| s.service);
                    let was = self.owner_of.get(&key).cloned();
                    if was == now {
                        touched.extend(now);
                        continue;
                    }
                    if let Some(o) = &was {
                        if let Some(set) = self.slices_of.get_mut(o) {
                            set.remove(&key);
                            if set.is_empty() {
                                self.slices_of.remove(o);
                            }
                        }
                        self.owner_of.remove(&key);
                    }
                    if let Some(o) = &now {
                        self.slices_of.entry(o.clone()).or_default().insert(key.clone());
                        self.owner_of.insert(key, o.clone());
                    }
                    touched.extend(was);
                    touched.extend(now);
                }
                let mut delta = Delta::default();
                for owner in touched {
                    let svc = services.get(&format!("{}/{}", owner.0, owner.1));
                    let theirs: Vec<SliceView> =
                        self.slices_of.get(&owner).into_iter().flatten().filter_map(|k| slices.get(k)).collect();
                    let theirs: Vec<&SliceView> = theirs.iter().collect();
                    let now = svc.map(|s| ports(&s, &theirs, &self.node)).unwrap_or_default();
                    self.replace_service(&owner, now, &mut delta);
                }
                delta
            }
            _ => self.reread(&services.list(), &slices.entries()),
        }
    }

    /// Everything from whole lists; the differences from before.
    fn reread(&mut self, services: &[ServiceView], slices: &[(String, SliceView)]) -> Delta {
        self.slices_of.clear();
        self.owner_of.clear();
        for (key, s) in slices {
            if let Some(o) = &s.service {
                self.slices_of.entry(o.clone()).or_default().insert(key.clone());
                self.owner_of.insert(key.clone(), o.clone());
            }
        }
        let next: BTreeMap<ServiceKey, ServiceState> = snapshot(services, slices.iter().map(|(_, s)| s), &self.node)
            .into_iter()
            .map(|st| (st.port.key(), st))
            .collect();
        let mut delta = Delta::default();
        for (k, st) in &self.states {
            if next.get(k) != Some(st) {
                delta.old.push(st.clone());
            }
        }
        for (k, st) in &next {
            if self.states.get(k) != Some(st) {
                delta.new.push(st.clone());
            }
        }
        self.states = next;
        delta
    }

    /// Swaps one Service's ports for `now`, noting the differences in `delta`.
    fn replace_service(&mut self, owner: &Owner, now: Vec<ServiceState>, delta: &mut Delta) {
        let from = ServiceKey { name: ServicePortName::new(&owner.0, &owner.1, ""), protocol: String::new() };
        let before: Vec<ServiceKey> = self
            .states
            .range(from..)
            .take_while(|(k, _)| k.name.namespace == owner.0 && k.name.name == owner.1)
            .map(|(k, _)| k.clone())
            .collect();
        let mut now: BTreeMap<ServiceKey, ServiceState> = now.into_iter().map(|st| (st.port.key(), st)).collect();
        for k in before {
            let old = self.states.remove(&k).expect("listed");
            match now.remove(&k) {
                Some(new) if new == old => {
                    self.states.insert(k, new);
                }
                Some(new) => {
                    delta.old.push(old);
                    delta.new.push(new.clone());
                    self.states.insert(k, new);
                }
                None => delta.old.push(old),
            }
        }
        for (k, new) in now {
            delta.new.push(new.clone());
            self.states.insert(k, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::discovery::v1 as discovery;
    use podpath_client::reflector::{Change, Watched};
    use serde_json::json;
    use std::sync::Arc;

    fn put_service(store: &Store<ServiceView>, s: core::Service) {
        store.apply(Change::Apply(s.key(), ServiceView::of(&s)));
    }
    fn put_slice(store: &Store<SliceView>, s: discovery::EndpointSlice) {
        store.apply(Change::Apply(s.key(), SliceView::of(&s)));
    }

    fn service(ns: &str, name: &str, ip: &str, ports: &[(&str, i32)]) -> core::Service {
        let ports: Vec<_> = ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect();
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
                                      "spec": {"clusterIP": ip, "ports": ports}}))
        .unwrap()
    }

    fn slice(ns: &str, name: &str, svc: &str, port: &str, addrs: &[&str]) -> discovery::EndpointSlice {
        let eps: Vec<_> = addrs.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": true}})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4", "ports": [{"name": port, "port": 8080, "protocol": "TCP"}], "endpoints": eps
        }))
        .unwrap()
    }

    fn keys(states: &[ServiceState]) -> Vec<String> {
        states.iter().map(|st| format!("{} {}", st.port.key(), st.endpoints.len())).collect()
    }

    /// After any sequence of changes, the tracked states are what a whole reading gives.
    fn check_whole(t: &Tracker, services: &Store<ServiceView>, slices: &Store<SliceView>) {
        let mut whole = Tracker::new(&t.node);
        whole.reread(&services.list(), &slices.entries());
        assert_eq!(t.list(), whole.list());
    }

    #[test]
    fn an_update_recomputes_and_returns_only_the_ports_that_changed() {
        let services: Arc<Store<ServiceView>> = Store::new();
        let slices: Arc<Store<SliceView>> = Store::new();
        let web = service("default", "web", "10.96.0.5", &[("http", 80), ("https", 443)]);
        let db = service("team", "db", "10.96.0.6", &[("pg", 5432)]);
        services.apply(Change::Replace([(web.key(), ServiceView::of(&web)), (db.key(), ServiceView::of(&db))].into()));
        let a = slice("default", "web-a", "web", "http", &["10.0.0.1", "10.0.0.2"]);
        slices.apply(Change::Replace([(a.key(), SliceView::of(&a))].into()));
        let mut t = Tracker::new("node-1");
        let d = t.update(&services, &slices);
        assert!(d.old.is_empty());
        assert_eq!(keys(&d.new), ["default/web:http tcp 2", "default/web:https tcp 0", "team/db:pg tcp 0"]);
        assert!(t.update(&services, &slices).is_empty(), "nothing changed");

        // A second slice of web: only web's http port changed.
        put_slice(&slices, slice("default", "web-b", "web", "http", &["10.0.0.3"]));
        let d = t.update(&services, &slices);
        assert_eq!(
            (keys(&d.old), keys(&d.new)),
            (vec!["default/web:http tcp 2".into()], vec!["default/web:http tcp 3".into()])
        );
        check_whole(&t, &services, &slices);

        // A slice relabelled to another Service moves its endpoints; then deleted.
        let mut moved = slice("default", "web-b", "other", "http", &["10.0.0.3"]);
        put_slice(&slices, moved.clone());
        let d = t.update(&services, &slices);
        assert_eq!(keys(&d.new), ["default/web:http tcp 2"]);
        let other = service("default", "other", "10.96.0.7", &[("http", 80)]);
        put_service(&services, other);
        let d = t.update(&services, &slices);
        assert_eq!((keys(&d.old), keys(&d.new)), (vec![], vec!["default/other:http tcp 1".to_string()]));
        moved.metadata.labels = None;
        put_slice(&slices, moved);
        assert_eq!(keys(&t.update(&services, &slices).new), ["default/other:http tcp 0"]);
        check_whole(&t, &services, &slices);

        // A port removed from a Service, a Service deleted.
        put_service(&services, service("default", "web", "10.96.0.5", &[("http", 80)]));
        let d = t.update(&services, &slices);
        assert_eq!((keys(&d.old), keys(&d.new)), (vec!["default/web:https tcp 0".to_string()], vec![]));
        services.apply(Change::Delete("team/db".into()));
        assert_eq!(keys(&t.update(&services, &slices).old), ["team/db:pg tcp 0"]);
        check_whole(&t, &services, &slices);

        // A store replaced whole (a relist): read again, still only the differences.
        let c = slice("default", "web-c", "web", "http", &["10.0.0.9"]);
        let all: BTreeMap<_, _> = slices.entries().into_iter().chain([(c.key(), SliceView::of(&c))]).collect();
        slices.apply(Change::Replace(all));
        let d = t.update(&services, &slices);
        assert_eq!(
            (keys(&d.old), keys(&d.new)),
            (vec!["default/web:http tcp 2".into()], vec!["default/web:http tcp 3".into()])
        );
        check_whole(&t, &services, &slices);
    }
}
