//! Events from components outside the API server (kubelet's role in the node agent, the load
//! balancer's in lb-sim): a bounded queue the component's logic writes to without waiting, and
//! a forwarder that sends each report to `Events.Record`, where the server builds the core/v1
//! Event and aggregates repeats (count, lastTimestamp) as client-go's recorder does.

use api::proto as pb;
use tokio::sync::mpsc;

use crate::ApiClient;

/// The longest message sent (events.k8s.io/v1's limit on `note`; the server refuses longer).
pub const MAX_MESSAGE: usize = 1024;

/// Reports waiting to be sent; beyond this they are dropped (client-go's queue is 1000 too).
pub const QUEUE: usize = 1000;

/// One thing seen happening to one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub kind: pb::Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The part of the object (`spec.containers{web}`), if any.
    pub field_path: Option<String>,
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Where a component's logic puts its reports. When the queue is full (the API server is slow or
/// away), reports are dropped with a warning: events are best effort and never hold work up.
#[derive(Clone, Debug)]
pub struct Recorder(mpsc::Sender<Report>);

impl Recorder {
    /// A recorder and the receiving end ([`forward`] drains it; tests read it).
    pub fn channel(capacity: usize) -> (Recorder, mpsc::Receiver<Report>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Recorder(tx), rx)
    }

    /// A recorder whose reports go to the API server as `component` on `host`.
    pub fn start(client: &ApiClient, component: &'static str, host: Option<String>) -> Recorder {
        let (rec, rx) = Recorder::channel(QUEUE);
        tokio::spawn(forward(rx, client.clone(), component, host));
        rec
    }

    pub fn emit(&self, mut r: Report) {
        r.message = cut(r.message);
        if let Err(mpsc::error::TrySendError::Full(r)) = self.0.try_send(r) {
            tracing::warn!(object = %format!("{}/{}", r.namespace, r.name), reason = r.reason, "event queue full; event dropped");
        }
    }
}

/// `message` cut to at most [`MAX_MESSAGE`] bytes on a character boundary (a probe's output can
/// be long).
fn cut(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

/// Sends reports as `component` (on `host`) until every [`Recorder`] is gone. A report the
/// server refuses or cannot take is logged and dropped.
pub async fn forward(mut rx: mpsc::Receiver<Report>, client: ApiClient, component: &'static str, host: Option<String>) {
    let mut events = client.events.clone();
    while let Some(r) = rx.recv().await {
        let reason = r.reason;
        let report = pb::EventReport {
            kind: r.kind.into(),
            namespace: r.namespace,
            name: r.name,
            uid: r.uid,
            resource_version: r.resource_version,
            field_path: r.field_path.unwrap_or_default(),
            warning: r.warning,
            reason: reason.to_string(),
            message: r.message,
            component: component.to_string(),
            host: host.clone().unwrap_or_default(),
        };
        if let Err(status) = events.record(report).await {
            tracing::warn!(reason, "cannot record an event: {}", status.message());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        assert_eq!(cut("short".into()), "short");
        let long = "é".repeat(600); // 1200 bytes
        let c = cut(long);
        assert!(c.len() <= MAX_MESSAGE && c.ends_with("...") && c.starts_with('é'), "{}", c.len());
    }

    #[tokio::test]
    async fn a_full_queue_drops_instead_of_waiting() {
        let (rec, mut rx) = Recorder::channel(1);
        let r = Report {
            kind: pb::Kind::Pod,
            namespace: "default".into(),
            name: "web".into(),
            uid: "u".into(),
            resource_version: "1".into(),
            field_path: None,
            warning: false,
            reason: "Started",
            message: "Started container web".into(),
        };
        rec.emit(r.clone());
        rec.emit(Report { reason: "Killing", ..r.clone() });
        assert_eq!(rx.try_recv().unwrap().reason, "Started");
        assert!(rx.try_recv().is_err(), "the second one was dropped");
    }
}
