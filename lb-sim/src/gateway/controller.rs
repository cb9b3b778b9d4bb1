//! The Gateway API controller's I/O: follows the Gateway API's objects (when their CRDs are
//! installed) and what they refer to, applies [`super::plan::plan`] — each Gateway's
//! LoadBalancer Service made, changed or removed, statuses written where they differ — and hands
//! the sites to the proxy. EndpointSlices and Namespaces are followed only while a GatewayClass
//! of this controller exists: a lab without the Gateway API keeps no copy of them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use api::k8s_openapi::api::core::v1 as core;
use api::k8s_openapi::api::discovery::v1::EndpointSlice;
use api::proto as pb;
use podpath_client::reflector::{self, Filter, Store};
use podpath_client::ApiClient;
use serde_json::Value;
use tokio::sync::watch;

use super::plan::{self, Inputs, Site};
use super::types::*;

/// The stores the controller reads.
pub struct Stores {
    pub classes: Arc<Store<Value>>,
    pub gateways: Arc<Store<Value>>,
    pub http_routes: Arc<Store<Value>>,
    pub grpc_routes: Arc<Store<Value>>,
    pub grants: Arc<Store<Value>>,
    pub services: Arc<Store<core::Service>>,
    pub slices: Arc<Store<EndpointSlice>>,
    pub secrets: Arc<Store<core::Secret>>,
    pub namespaces: Arc<Store<core::Namespace>>,
    client: ApiClient,
    /// The reflectors of `slices` and `namespaces`, while they run.
    following: Vec<tokio::task::JoinHandle<()>>,
}

impl Stores {
    /// Starts following everything (custom resources whose CRD is missing are retried quietly).
    pub fn follow(
        client: &ApiClient,
        services: Arc<Store<core::Service>>,
        secrets: Arc<Store<core::Secret>>,
    ) -> Stores {
        let custom = |resource: &'static str| {
            let store = Store::<Value>::new();
            tokio::spawn(reflector::run_custom(client.clone(), resource, Filter::default(), store.clone()));
            store
        };
        Stores {
            classes: custom(GATEWAY_CLASSES),
            gateways: custom(GATEWAYS),
            http_routes: custom(HTTP_ROUTES),
            grpc_routes: custom(GRPC_ROUTES),
            grants: custom(REFERENCE_GRANTS),
            services,
            slices: Store::new(),
            secrets,
            namespaces: Store::new(),
            client: client.clone(),
            following: Vec::new(),
        }
    }

    /// Follows EndpointSlices and Namespaces when `wanted`, else stops and forgets them.
    fn follow_references(&mut self, wanted: bool) {
        match (wanted, self.following.is_empty()) {
            (true, true) => {
                tracing::info!("a GatewayClass of podpath exists: following EndpointSlices and Namespaces");
                self.following = vec![
                    tokio::spawn(reflector::run(self.client.clone(), Filter::default(), self.slices.clone())),
                    tokio::spawn(reflector::run(self.client.clone(), Filter::default(), self.namespaces.clone())),
                ];
            }
            (false, false) => {
                tracing::info!("no GatewayClass of podpath: EndpointSlices and Namespaces no longer followed");
                self.following.drain(..).for_each(|t| t.abort());
                self.slices.apply(reflector::Change::Replace(Default::default()));
                self.namespaces.apply(reflector::Change::Replace(Default::default()));
            }
            _ => {}
        }
    }

    fn inputs(&self) -> Inputs {
        fn decoded<S: for<'de> serde::Deserialize<'de> + Default>(s: &Store<Value>) -> Vec<Obj<S>> {
            s.list().iter().filter_map(Obj::from_json).collect()
        }
        Inputs {
            classes: decoded(&self.classes),
            gateways: decoded(&self.gateways),
            http_routes: decoded(&self.http_routes),
            grpc_routes: decoded(&self.grpc_routes),
            grants: decoded(&self.grants),
            services: self.services.list(),
            slices: self.slices.list(),
            secrets: self.secrets.list(),
            namespaces: self.namespaces.list(),
        }
    }
}

fn now() -> String {
    let t = jiff::Timestamp::now();
    jiff::Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

/// Writes `status` to a custom object when it differs from what it has.
async fn write_status(client: &ApiClient, resource: &str, current: &Value, mut status: Value) {
    plan::merge_conditions(&current["status"], &mut status, &now());
    if current["status"] == status {
        return;
    }
    let mut obj = current.clone();
    obj["status"] = status;
    let req = pb::CustomObject { resource: resource.to_string(), json: obj.to_string() };
    if let Err(e) = client.custom.clone().update_status(req).await {
        // A conflict (the object changed meanwhile) is retried with the next pass.
        tracing::debug!(resource, key = %reflector::json_key(current), error = %e, "status not written");
    }
}

/// Makes each Gateway's Service as planned, and removes those of Gateways that are gone.
async fn sync_services(client: &ApiClient, wanted: &[core::Service], have: &[core::Service]) {
    let key = |s: &core::Service| {
        (s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone().unwrap_or_default())
    };
    for w in wanted {
        let current = have.iter().find(|h| key(h) == key(w));
        let ports = |s: &core::Service| -> Vec<i32> {
            s.spec
                .as_ref()
                .and_then(|sp| sp.ports.as_ref())
                .map(|ps| ps.iter().map(|p| p.port).collect())
                .unwrap_or_default()
        };
        let result = match current {
            None => client.services.clone().create(api::convert::to_proto(w)).await.map(|_| ()),
            Some(c) if ports(c) != ports(w) => {
                let mut next = c.clone();
                if let (Some(spec), Some(want)) = (next.spec.as_mut(), w.spec.as_ref()) {
                    spec.ports = want.ports.clone();
                }
                client.services.clone().update(api::convert::to_proto(&next)).await.map(|_| ())
            }
            Some(_) => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(service = %format!("{}/{}", key(w).0, key(w).1), error = %e, "cannot write a Gateway's Service");
        }
    }
    let wanted_keys: BTreeSet<(String, String)> = wanted.iter().map(key).collect();
    for h in have.iter().filter(|h| plan::is_gateway_service(h) && !wanted_keys.contains(&key(h))) {
        let (ns, name) = key(h);
        let req = pb::DeleteRequest { namespace: ns, name, ..Default::default() };
        if let Err(e) = client.services.clone().delete(req).await {
            tracing::debug!(error = %e, "Gateway Service not deleted");
        }
    }
}

/// Runs the controller forever, publishing the sites on `sites`.
pub async fn run(client: ApiClient, mut stores: Stores, sites: watch::Sender<Vec<Site>>) {
    let mut changes = [
        stores.classes.changes(),
        stores.gateways.changes(),
        stores.http_routes.changes(),
        stores.grpc_routes.changes(),
        stores.grants.changes(),
        stores.services.changes(),
        stores.slices.changes(),
        stores.secrets.changes(),
        stores.namespaces.changes(),
    ];
    let mut resync = tokio::time::interval(Duration::from_secs(10));
    loop {
        let inputs = stores.inputs();
        let p = plan::plan(&inputs);
        stores.follow_references(!p.classes.is_empty());
        if !p.classes.is_empty() || !p.services.is_empty() || inputs.services.iter().any(plan::is_gateway_service) {
            sync_services(&client, &p.services, &inputs.services).await;
        }
        for (name, conds, generation) in &p.classes {
            if let Some(current) = stores.classes.get(name) {
                let status = serde_json::json!({"conditions": plan::conds_json(conds, *generation)});
                write_status(&client, GATEWAY_CLASSES, &current, status).await;
            }
        }
        for (key, status) in &p.gateways {
            if let Some(current) = stores.gateways.get(key) {
                write_status(&client, GATEWAYS, &current, status.clone()).await;
            }
        }
        for (resource, key, parents, generation) in &p.routes {
            let store = if *resource == HTTP_ROUTES { &stores.http_routes } else { &stores.grpc_routes };
            if let Some(current) = store.get(key) {
                let status = plan::route_status(&current["status"], parents, *generation);
                write_status(&client, resource, &current, status).await;
            }
        }
        // Routes no longer attached to a Gateway of ours (their parentRef changed, or the
        // Gateway is gone) lose this controller's entries in their status, as the spec asks.
        for (resource, store) in [(HTTP_ROUTES, &stores.http_routes), (GRPC_ROUTES, &stores.grpc_routes)] {
            for (key, current) in store.entries() {
                let planned = p.routes.iter().any(|(r, k, ..)| *r == resource && *k == key);
                if !planned && plan::has_our_parents(&current["status"]) {
                    let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
                    let status = plan::route_status(&current["status"], &[], generation);
                    write_status(&client, resource, &current, status).await;
                }
            }
        }
        sites.send_if_modified(|s| {
            let changed = *s != p.sites;
            if changed {
                *s = p.sites.clone();
            }
            changed
        });
        // The next change of anything read; a burst of them makes one pass.
        let waits = futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())));
        tokio::select! {
            _ = waits => {},
            _ = resync.tick() => {},
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
