//! The DNS server: hickory's UDP and TCP serving (framing, truncation to the client's buffer
//! size, TCP for the rest) around [`Handler`], which answers every query from the current
//! [`Zone`]. The zone changes one object at a time under a write lock held for microseconds
//! (a whole relist: milliseconds); queries read it under the read lock.

use std::sync::{Arc, RwLock};

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Name};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;

use crate::metrics::{Metrics, Observation};
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

/// Answers queries from a [`SharedZone`], counting them.
pub struct Handler {
    pub zone: SharedZone,
    pub metrics: Arc<Metrics>,
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
        let name: Name = info.query.name().into();
        // The cluster zone is class IN; other classes (CHAOS's version.bind …) are not ours.
        let answer = if info.query.query_class() == DNSClass::IN {
            self.zone.read(|z| z.answer(&name, info.query.query_type()))
        } else {
            crate::records::Answer {
                code: ResponseCode::Refused,
                answers: vec![],
                authority: vec![],
                additional: vec![],
            }
        };
        self.metrics.observe(Observation {
            proto: if request.protocol() == hickory_server::net::xfer::Protocol::Udp { "udp" } else { "tcp" },
            family: if request.src().is_ipv4() { "1" } else { "2" },
            qtype: info.query.query_type().to_string(),
            rcode: rcode_label(answer.code),
        });
        tracing::debug!(query = %name, qtype = %info.query.query_type(), code = %answer.code, answers = answer.answers.len(), "answered");
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = answer.code != ResponseCode::Refused;
        metadata.recursion_available = false;
        metadata.response_code = answer.code;
        let msg = builder.build(metadata, answer.answers.iter(), answer.authority.iter(), [], answer.additional.iter());
        match response.send_response(msg).await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!("cannot send an answer to {}: {e}", request.src());
                failed(request)
            }
        }
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
