//! The DNS server: hickory's UDP and TCP serving (framing, truncation to the client's buffer
//! size, TCP for the rest) around [`Handler`], which answers every query from the current
//! [`Zone`]. The zone changes one object at a time under a write lock held for microseconds
//! (a whole relist: milliseconds); queries read it under the read lock.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::Name;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;

use crate::metrics::{Metrics, Observation};
use crate::pipeline::Pipeline;
use crate::records::Zone;

/// The zone queries are answered from; cheap to clone, shared with whoever updates it.
#[derive(Clone)]
pub struct SharedZone(Arc<RwLock<Zone>>);

impl SharedZone {
    pub fn new(zone: Zone) -> SharedZone {
        SharedZone(Arc::new(RwLock::new(zone)))
    }

    /// Reads the zone (a poisoned lock still holds a consistent zone: every update is a
    /// sequence of map operations that do not panic midway).
    pub fn read<R>(&self, f: impl FnOnce(&Zone) -> R) -> R {
        f(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn update<R>(&self, f: impl FnOnce(&mut Zone) -> R) -> R {
        f(&mut self.0.write().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn set(&self, zone: Zone) {
        self.update(|z| *z = zone);
    }
}

/// The loaded Corefile; swapped whole on a reload, queries in flight keep the one they began with.
#[derive(Clone)]
pub struct SharedPipeline(Arc<RwLock<Arc<Pipeline>>>);

impl SharedPipeline {
    pub fn new(p: Pipeline) -> SharedPipeline {
        SharedPipeline(Arc::new(RwLock::new(Arc::new(p))))
    }

    pub fn get(&self) -> Arc<Pipeline> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, p: Pipeline) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(p);
    }
}

/// Answers queries through the Corefile's plugins, counting them.
pub struct Handler {
    pub zone: SharedZone,
    pub metrics: Arc<Metrics>,
    pub pipeline: SharedPipeline,
}

impl Handler {
    /// With the built-in Corefile for the zone's settings (the cluster zone, nothing forwarded).
    pub fn builtin(zone: SharedZone, metrics: Arc<Metrics>) -> Handler {
        let cfg = zone.read(|z| z.config().clone());
        let text = crate::corefile::builtin(None, &cfg.domain.to_string(), cfg.ttl, None, None, None);
        let pipeline =
            Pipeline::build(&text, "Corefile", SocketAddr::from(([0, 0, 0, 0], 53)), &|p| std::fs::read_to_string(p))
                .expect("the built-in Corefile loads");
        Handler { zone, metrics, pipeline: SharedPipeline::new(pipeline) }
    }
}

/// CoreDNS's label for a response code.
pub fn rcode_label(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "NOERROR".into(),
        ResponseCode::FormErr => "FORMERR".into(),
        ResponseCode::ServFail => "SERVFAIL".into(),
        ResponseCode::NXDomain => "NXDOMAIN".into(),
        ResponseCode::NotImp => "NOTIMP".into(),
        ResponseCode::Refused => "REFUSED".into(),
        other => u16::from(other).to_string(),
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(&self, request: &Request, mut response: R) -> ResponseInfo {
        let started = Instant::now();
        // EDNS: answer in kind, with the client's buffer size (at least 512), version 0.
        let edns = request.edns.as_ref().map(|e| {
            let mut out = Edns::new();
            out.set_max_payload(e.max_payload().max(512));
            out.set_version(0);
            out
        });
        let builder = MessageResponseBuilder::new(&request.queries, edns.as_ref());
        let refuse = |code: ResponseCode| builder_error(&request.queries, edns.as_ref(), &request.metadata, code);
        if request.metadata.message_type != MessageType::Query || request.metadata.op_code != OpCode::Query {
            let code =
                if request.metadata.op_code == OpCode::Query { ResponseCode::FormErr } else { ResponseCode::NotImp };
            return send(&mut response, refuse(code), request).await;
        }
        let Ok(info) = request.request_info() else {
            return send(&mut response, refuse(ResponseCode::FormErr), request).await;
        };
        let query = info.query.original().clone();
        let pipeline = self.pipeline.get();
        let rd = request.metadata.recursion_desired;
        let outcome = pipeline.resolve(&self.zone, &query, rd).await;
        if outcome.looped {
            let p = pipeline.loop_probe.as_ref().map(|p| (p.target, p.name.clone()));
            if let Some((target, name)) = p {
                let zone =
                    outcome.block.and_then(|b| pipeline.blocks[b].zones.first().cloned()).unwrap_or_else(Name::root);
                println!(
                    "[FATAL] plugin/loop: Loop ({target} -> :{}) detected for zone \"{zone}\", see https://coredns.io/plugins/loop#troubleshooting. Query: \"HINFO {name}\"",
                    target.port()
                );
            }
            std::process::exit(1);
        }
        let reply = outcome.reply;
        let proto = if request.protocol() == hickory_server::net::xfer::Protocol::Udp { "udp" } else { "tcp" };
        self.metrics.observe(Observation {
            proto,
            family: if request.src().is_ipv4() { "1" } else { "2" },
            qtype: query.query_type().to_string(),
            rcode: rcode_label(reply.code),
        });
        let block = outcome.block.map(|b| &pipeline.blocks[b]);
        if let (Some(err), Some(b)) = (&outcome.error, block) {
            if b.plugins.errors {
                println!("{}", crate::pipeline::error_line(reply.code, &query, err));
            }
        }
        tracing::debug!(query = %query.name(), qtype = %query.query_type(), code = %reply.code, answers = reply.answers.len(), "answered");
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = reply.authoritative;
        metadata.recursion_available = reply.recursion_available;
        metadata.response_code = reply.code;
        let msg = builder.build(metadata, reply.answers.iter(), reply.authority.iter(), [], reply.additional.iter());
        let sent = match response.send_response(msg).await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!("cannot send an answer to {}: {e}", request.src());
                return failed(request);
            }
        };
        if block.is_some_and(|b| crate::pipeline::logs(b, query.name(), &reply)) {
            let truncated = sent.truncation;
            let c = sent.counts();
            let first = |v: &[hickory_server::proto::rr::Record], n: u16| v.iter().take(n as usize).cloned().collect();
            // The size of the answer sent: the message again, encoded (only when logging).
            let mut m = hickory_server::proto::op::Message::response(request.metadata.id, OpCode::Query);
            m.add_query(query.clone());
            m.insert_answers(first(&reply.answers, c.answers));
            m.insert_authorities(first(&reply.authority, c.authorities));
            m.insert_additionals(first(&reply.additional, c.additionals));
            if let Some(e) = edns.clone() {
                m.set_edns(e);
            }
            let rsize = m.to_vec().map(|v| v.len()).unwrap_or(0);
            let e = request.edns.as_ref();
            println!(
                "{}",
                crate::pipeline::log_line(
                    request.src(),
                    request.metadata.id,
                    &query,
                    proto,
                    request.as_slice().len(),
                    e.is_some_and(|e| e.flags().dnssec_ok),
                    e.map_or(512, |e| e.max_payload().max(512)),
                    &rcode_label(reply.code),
                    &crate::pipeline::flags(reply.authoritative, truncated, rd, reply.recursion_available),
                    rsize,
                    started.elapsed(),
                )
            );
        }
        sent
    }
}

type ErrorResponse<'q> = hickory_server::zone_handler::MessageResponse<
    'q,
    'static,
    std::iter::Empty<&'static hickory_server::proto::rr::Record>,
    std::iter::Empty<&'static hickory_server::proto::rr::Record>,
    std::iter::Empty<&'static hickory_server::proto::rr::Record>,
    std::iter::Empty<&'static hickory_server::proto::rr::Record>,
>;

fn builder_error<'q>(
    queries: &'q hickory_server::zone_handler::Queries,
    edns: Option<&'q Edns>,
    request: &Metadata,
    code: ResponseCode,
) -> ErrorResponse<'q> {
    let mut metadata = Metadata::response_from_request(request);
    metadata.response_code = code;
    MessageResponseBuilder::new(queries, edns).build(
        metadata,
        std::iter::empty(),
        std::iter::empty(),
        std::iter::empty(),
        std::iter::empty(),
    )
}

async fn send<R: ResponseHandler>(response: &mut R, msg: ErrorResponse<'_>, request: &Request) -> ResponseInfo {
    match response.send_response(msg).await {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!("cannot send an answer to {}: {e}", request.src());
            failed(request)
        }
    }
}

/// What is reported when even the answer could not be sent.
fn failed(request: &Request) -> ResponseInfo {
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.response_code = ResponseCode::ServFail;
    hickory_server::proto::op::Header { metadata, counts: Default::default() }.into()
}
