//! lb-sim assembled: watch Services and Nodes, check the nodes' health, and keep the gateway's
//! routes, addresses and NodePort proxies in line with both.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use api::k8s_openapi::api::core::v1 as core;
use api::k8s_openapi::api::networking::v1::Ingress;
use podpath_client::events::{Recorder, Report};
use podpath_client::reflector::{self, Filter, Store, Watched};
use podpath_client::ApiClient;

use crate::error::{LbError, Result};
use crate::events::{self, Reporter};
use crate::health::{self, Checker};
use crate::l7;
use crate::l7_proxy::Sites;
use crate::model::{self, Check, Mode};
use crate::proxy::Proxies;
use crate::routing::{self, Ip, Wanted};
use crate::status::{self, Status};

/// Routes are compared with the kernel at least this often (someone may have changed them).
pub const RESYNC: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct Config {
    /// gRPC address of apiserver-lite.
    pub apiserver: String,
    pub token: Option<String>,
    /// The API server's CA (PEM): TLS to the API; None: plain HTTP.
    pub ca: Option<String>,
    pub mode: Mode,
    /// Where `GET /status` is served (None: nowhere).
    pub status_listen: Option<SocketAddr>,
    /// kube-proxy's health port on the nodes.
    pub node_health_port: u16,
}

/// The gateway as the binary runs it, on a runtime of its own: the real `ip` tool, stopped by
/// SIGTERM or SIGINT. A plain (not generic, not async) function, so the whole program is
/// compiled once, in this crate: a release build compiles generic and async code again in every
/// crate that instantiates it, and the binary would compile all of [`run`] a second time.
pub fn run_gateway(cfg: Config) -> Result<()> {
    let shutdown = async {
        podpath_client::daemon::stop_signal().await;
        tracing::info!("stopping");
    };
    podpath_client::daemon::block_on(2, run(cfg, Arc::new(routing::IpCommand::default()), shutdown))
        .map_err(|e| LbError::io("start the async runtime", e))?
}

/// Runs until `shutdown`, then removes the routes, addresses and listeners it made.
pub async fn run<I: Ip>(cfg: Config, ip: Arc<I>, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    // The gateway may start first; give up after 30 s so a wrong address is reported.
    let client = ApiClient::connect_patiently(
        &cfg.apiserver,
        cfg.token.as_deref(),
        cfg.ca.as_deref(),
        Some(Duration::from_secs(30)),
    )
    .await?;
    let services = Store::<core::Service>::new();
    let nodes = Store::<core::Node>::new();
    let ingresses = Store::<Ingress>::new();
    let secrets = Store::<core::Secret>::new();
    tokio::spawn(reflector::run(client.clone(), Filter::default(), services.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), nodes.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), ingresses.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), secrets.clone()));
    // The Gateway API: its controller follows the Gateway API's objects (once their CRDs are
    // installed) and publishes the sites the proxy serves.
    let (gw_sites_tx, mut gw_sites) = tokio::sync::watch::channel(Vec::new());
    let gw_stores = crate::gateway::controller::Stores::follow(&client, services.clone(), secrets.clone());
    tokio::spawn(crate::gateway::controller::run(client.clone(), gw_stores, gw_sites_tx));
    let mut gateways = crate::gateway::proxy::GatewaySites::default();
    let recorder = Recorders {
        service_controller: Recorder::start(&client, Reporter::ServiceController.component(), None),
        lb_sim: Recorder::start(&client, Reporter::LbSim.component(), None),
    };
    let status = Arc::new(RwLock::new(status::Shared {
        doc: Status { mode: cfg.mode.to_string(), ..Status::default() },
        counters: Default::default(),
        decisions: None,
    }));
    if let Some(addr) = cfg.status_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| LbError::io(format!("listen on {addr} (--status-listen)"), e))?;
        tracing::info!(%addr, "status on GET /status");
        tokio::spawn(status::serve(l, status.clone()));
    }
    for problem in routing::hash_by_five_tuple() {
        tracing::warn!("{problem}");
    }
    services.wait_synced().await;
    nodes.wait_synced().await;
    ingresses.wait_synced().await;
    secrets.wait_synced().await;
    tracing::info!(mode = %cfg.mode, "watching Services, Nodes, Ingresses and Secrets");

    let checker = Checker::new(health::INTERVAL, health::TIMEOUT);
    let mut svc_changes = services.changes();
    let mut node_changes = nodes.changes();
    let mut health_changes = checker.changes();
    let mut ingress_changes = ingresses.changes();
    let mut secret_changes = secrets.changes();
    let mut proxies = Proxies::default();
    let mut l7 = Sites::default();
    let mut applied: Option<Wanted> = None;
    // What the last routing sync left in the kernel (None: read it first).
    let mut known: Option<routing::Observed> = None;
    let mut seen = events::Seen::default();
    let mut resync = tokio::time::interval(RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        let node_list = nodes.list();
        let lb_nodes = model::lb_nodes(&node_list);
        let svc_list = services.list();
        // The Gateways' own Services are served by the Gateway proxy, not passed through.
        let lb_services: Vec<core::Service> =
            svc_list.iter().filter(|s| !crate::gateway::plan::is_gateway_service(s)).cloned().collect();
        let frontends = model::frontends(&lb_services, &lb_nodes, cfg.mode, cfg.node_health_port);
        let gw_site_list = gw_sites.borrow_and_update().clone();
        let sites = l7::sites(&ingresses.list(), &svc_list, &secrets.list());
        // The L7 load balancer checks every node the way kube-proxy answers for it.
        let node_checks: Vec<(String, IpAddr, Check)> = lb_nodes
            .iter()
            .map(|n| (n.name.clone(), n.ip, Check { ip: n.ip, port: cfg.node_health_port, path: "/healthz".into() }))
            .collect();
        let mut checks = model::checks(&frontends);
        if !sites.is_empty() {
            checks.extend(node_checks.iter().map(|(_, _, c)| c.clone()));
        }
        checker.set_targets(checks.iter());
        let healthy = |c: &Check| checker.healthy(c);
        let rotation: Vec<&(String, IpAddr, Check)> = node_checks.iter().filter(|(_, _, c)| healthy(c)).collect();
        let mut addresses = model::local_addresses(&frontends);
        addresses.extend(sites.iter().map(|s| s.vip));
        addresses.extend(gw_site_list.iter().map(|s| s.vip));
        let subnets =
            if gw_site_list.is_empty() { Default::default() } else { model::pod_subnets(&node_list, &lb_nodes) };
        let want = Wanted { routes: model::routes(&frontends, &healthy), addresses, subnets };
        let mut errors = Vec::new();
        if applied.as_ref() != Some(&want) {
            let (ip2, want2, mut known2) = (ip.clone(), want.clone(), known.take());
            let (done, known2) = tokio::task::spawn_blocking(move || {
                let done = routing::sync(ip2.as_ref(), &want2, &mut known2);
                (done, known2)
            })
            .await
            .expect("routing task");
            known = known2;
            match done {
                Ok(_) => applied = Some(want),
                Err(e) => {
                    tracing::error!(error = %e, "cannot update the gateway's routes; retrying");
                    errors.push(e.to_string());
                    applied = None;
                }
            }
        }
        errors.extend(proxies.set(&model::proxies(&frontends, &healthy)).await);
        let rotation_ips: Vec<IpAddr> = rotation.iter().map(|(_, ip, _)| *ip).collect();
        errors.extend(l7.set(&sites, &rotation_ips).await);
        errors.extend(gateways.set(&gw_site_list).await);
        for e in &errors {
            tracing::warn!(error = %e, "gateway not fully in line with the Services");
        }
        let ingress_list = ingresses.list();
        let site_versions: Vec<(String, String)> = sites
            .iter()
            .filter_map(|s| {
                let ing = ingress_list.iter().find(|i| i.key() == s.ingress)?;
                Some((s.ingress.clone(), ing.metadata.resource_version.clone().unwrap_or_default()))
            })
            .collect();
        let now = events::observe(&frontends, &checker.snapshot(), &site_versions);
        let (evs, kept) = events::diff(&seen, &now, errors.first().map(String::as_str));
        seen = kept;
        for e in evs {
            recorder.emit(e, &svc_list, &ingress_list);
        }
        let mut doc = status::build(cfg.mode, &lb_nodes, &frontends, &checker.snapshot(), |a| proxies.counters(a));
        let rotation_names: Vec<String> = rotation.iter().map(|(n, _, _)| n.clone()).collect();
        doc.ingresses = status::sites(&sites, &rotation_names, |v| l7.counts(v), |v| l7.tls_note(v));
        doc.gateways = status::gateway_sites(&gw_site_list, |v, p| gateways.counts(v, p));
        doc.error = errors.first().cloned();
        *status.write().expect("status lock") =
            status::Shared { doc, counters: proxies.counter_handles(), decisions: Some(gateways.decisions.clone()) };

        tokio::select! {
            _ = &mut shutdown => break,
            _ = svc_changes.changed() => {},
            _ = node_changes.changed() => {},
            _ = health_changes.changed() => {},
            _ = ingress_changes.changed() => {},
            _ = secret_changes.changed() => {},
            _ = gw_sites.changed() => {},
            _ = resync.tick() => {
                // A resync reads the kernel again, and so repairs what was changed behind
                // lb-sim's back (a route deleted by hand).
                applied = None;
                known = None;
                if !errors.is_empty() {
                    tracing::info!("retrying after errors");
                }
            },
        }
    }
    proxies.stop_all();
    l7.stop_all();
    gateways.stop_all();
    let ip2 = ip.clone();
    // Read afresh: everything lb-sim owns goes, whatever the last sync believed.
    tokio::task::spawn_blocking(move || routing::sync(ip2.as_ref(), &Wanted::default(), &mut None))
        .await
        .expect("routing task")?;
    tracing::info!("removed the gateway's routes and addresses");
    Ok(())
}

/// The two reporters lb-sim writes events as.
struct Recorders {
    service_controller: Recorder,
    lb_sim: Recorder,
}

impl Recorders {
    /// Sends `e` about the object it names (skipped if the object is gone meanwhile).
    fn emit(&self, e: events::Event, services: &[core::Service], ingresses: &[Ingress]) {
        let (kind, meta) = match e.object {
            events::Object::Service => {
                (api::proto::Kind::Service, services.iter().find(|s| s.key() == e.key).map(|s| &s.metadata))
            }
            events::Object::Ingress => {
                (api::proto::Kind::Ingress, ingresses.iter().find(|i| i.key() == e.key).map(|i| &i.metadata))
            }
        };
        let Some(meta) = meta else { return };
        let report = Report {
            kind,
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            field_path: None,
            warning: e.warning,
            reason: e.reason,
            message: e.message,
        };
        match e.reporter {
            Reporter::ServiceController => self.service_controller.emit(report),
            Reporter::LbSim => self.lb_sim.emit(report),
        }
    }
}
