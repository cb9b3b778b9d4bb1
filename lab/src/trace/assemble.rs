//! From what the kernel observed to a trace people can read (pure): the flow ([`super::flow`]),
//! each host's steps ([`super::steps`]), the relays, the conntrack entries of the flow, and
//! where and why a failed request stopped.

use std::net::SocketAddr;

use podpath_ruleset::Target;

use super::flow::{follow, reply_path, Observed, Relay, Tuples};
use super::model::{name_of, route_text, step, Hop, Objects, Outcome, Step, Trace};
use super::parse::Observation;
use super::steps::{node_steps, saved_rules, service_of};

/// Assembles the trace.
pub fn assemble(observed: &Observed, objects: &Objects, outcome: Outcome) -> Trace {
    let (src, dst) = (observed.src.expect("probe source"), observed.dst.expect("probe destination"));
    let flow = follow(observed);
    let mut stopped = None;
    let mut hops: Vec<Hop> = Vec::new();
    let mut pod = None;
    let mut pod_saw = None;
    for (k, leg) in flow.legs.iter().enumerate() {
        let t = &leg.tuples;
        let relay = flow.relays.get(k);
        for host in &leg.path {
            let obs: Vec<&Observation> =
                observed.packets[host].iter().filter(|o| o.is_syn() && t.forward.contains(&(o.src, o.dst))).collect();
            let mut steps = Vec::new();
            if host.starts_with("node-") {
                // The source this host gave the flow, if it masqueraded it.
                let masq_src = observed.conntrack.get(host).and_then(|cts| {
                    cts.iter()
                        .find(|e| t.forward.contains(&e.orig) && e.reply.1.ip() != e.orig.0.ip())
                        .map(|e| e.reply.1)
                });
                steps.extend(node_steps(host, &obs, objects, masq_src, &mut stopped));
            }
            let next = leg.path.iter().skip_while(|h| *h != host).nth(1);
            let stopped_here = steps.iter().any(|s| s.kind == "stop");
            match (host.as_str(), objects.lb.as_ref(), next) {
                // The gateway's choice among nodes is observed: the node that received the packet.
                ("gateway", Some((mode, nodes)), Some(next)) if k == 0 => {
                    let dst = obs.last().map(|o| o.dst.ip().to_string()).unwrap_or_default();
                    steps.push(Step {
                        kind: "lb".into(),
                        text: format!("route {dst} → {next} ({mode}{})", also_in_rotation(nodes, next)),
                        rule: None,
                        object: None,
                    });
                }
                _ => {
                    let route = objects.routes.get(&(k, host.clone()));
                    if let Some(r) = route.filter(|_| !stopped_here) {
                        steps.push(step("route", route_text(objects, r)));
                    }
                }
            }
            // Delivered to a pod on this host's bridge? Seen as the packet's output interface
            // where a hook after routing traced it, else told by the route lookup.
            // (Not after a drop on this host: a NetworkPolicy's, say.)
            let bridged = obs
                .iter()
                .rev()
                .find_map(|o| o.oif.clone().filter(|i| i == "cni0" || i.starts_with("veth")).map(|i| (i, o)))
                .or_else(|| {
                    let route = objects.routes.get(&(k, host.clone()))?;
                    let dev = route.lines().next()?.split(" dev ").nth(1)?.split(' ').next()?.to_string();
                    let last = obs.last()?;
                    (dev == "cni0" && objects.pods.contains_key(&last.dst.ip())).then_some((dev, last))
                })
                .filter(|_| !stopped_here);
            if let Some((dev, o)) = bridged {
                let who = objects.pods.get(&o.dst.ip()).map(|(p, _)| p.clone());
                // The source the pod sees: this host's conntrack entry for the packet as delivered,
                // or the packet's own source when this host did not translate it.
                let seen = observed.conntrack.get(host).and_then(|cts| {
                    cts.iter().find(|e| e.reply.0 == o.dst && t.forward.contains(&e.orig)).map(|e| e.reply.1)
                });
                steps.push(step(
                    "deliver",
                    format!("bridge {dev} → pod {} ({})", who.clone().unwrap_or_else(|| "?".into()), o.dst),
                ));
                pod = who;
                pod_saw = seen.or(Some(o.src)).map(|s| s.to_string());
            }
            // A relay's own connection starts on the host that accepted the previous one.
            match hops.last_mut() {
                Some(last) if k > 0 && last.host == *host && leg.path.first() == Some(host) => last.steps.extend(steps),
                _ => hops.push(Hop { host: host.clone(), steps }),
            }
        }
        if let (Some(relay), Some(last)) = (relay, hops.last_mut()) {
            last.steps.push(relay_step(relay, objects, outcome.answered));
        }
    }
    let t = &flow.legs[0].tuples;
    let reply = reply_path(observed, t);
    // Conntrack of every host that translated the flow, leg by leg.
    let mut conntrack = Vec::new();
    for leg in &flow.legs {
        for host in &leg.path {
            for e in observed.conntrack.get(host).into_iter().flatten() {
                if leg.tuples.forward.contains(&e.orig) && e.is_natted() {
                    let line = format!("{host}: {}→{} ⇄ {}→{}", e.orig.0, e.orig.1, e.reply.0, e.reply.1);
                    if !conntrack.contains(&line) {
                        conntrack.push(line);
                    }
                }
            }
        }
    }
    if !outcome.answered && stopped.is_none() {
        let last_leg = flow.legs.last().expect("one leg at least");
        stopped = Some(explain_failure(observed, t, &last_leg.path, &reply, objects));
    }
    Trace {
        from: observed.from.clone(),
        src: src.to_string(),
        dst: dst.to_string(),
        hops,
        pod,
        pod_saw,
        outcome,
        stopped,
        conntrack,
        reply_path: reply,
        lookup: None,
    }
}

fn also_in_rotation(nodes: &[String], chosen: &str) -> String {
    let others: Vec<&str> = nodes.iter().filter(|n| *n != chosen).map(String::as_str).collect();
    if others.is_empty() {
        String::new()
    } else {
        format!("; {} also in rotation", others.join(", "))
    }
}

/// What a relay did: who accepted the connection, and the connections it opened for it.
fn relay_step(relay: &Relay, objects: &Objects, answered: bool) -> Step {
    let (who, object) = if relay.host == "gateway" {
        let mode = objects.lb.as_ref().map(|(m, _)| m.clone()).unwrap_or_else(|| "load balancer".into());
        (format!("lb-sim ({mode})"), None)
    } else {
        // The userspace proxy's port leads back to its Service through the REDIRECT rule.
        let port = relay.accepted_on.port();
        let service = objects.nat_rules.get(&relay.host).and_then(|save| {
            saved_rules(save)
                .into_iter()
                .find(|r| match &r.target {
                    Some(Target::Redirect { to_ports }) => to_ports.parse() == Ok(port),
                    Some(Target::Dnat { to }) => to.parse::<SocketAddr>().is_ok_and(|a| a.port() == port),
                    _ => false,
                })
                .and_then(|r| r.comment_text().map(str::to_string))
        });
        let text = match &service {
            Some(s) => format!("node-agent's userspace proxy for {s}"),
            None => "node-agent's userspace proxy".to_string(),
        };
        (text, service.as_deref().and_then(service_of).map(|s| format!("Service {s}")))
    };
    let mut lines = vec![format!("{who} accepted on {}", relay.accepted_on)];
    let many = relay.attempts.len() > 1;
    for (i, (leg, result)) in relay.attempts.iter().enumerate() {
        let to = leg.start.1;
        let name = name_of(objects, to.ip()).map(|n| format!(" ({n})")).unwrap_or_default();
        let nth = if many { format!("attempt {}", i + 1) } else { "connection".to_string() };
        // The connection the answer came back on was made, whatever conntrack kept of it.
        let result = if answered && i + 1 == relay.attempts.len() { "connected" } else { result.as_str() };
        let mut line = format!("{nth}: {} → {to}{name} {result}", leg.start.0);
        if relay.host == "gateway" && i + 1 == relay.attempts.len() {
            if let (Some((_, nodes)), Some(node)) = (&objects.lb, objects.nodes.get(&to.ip())) {
                line += &also_in_rotation(nodes, node);
            }
        }
        lines.push(line);
    }
    // A Gateway's decision: its listener, rule, filters and the backend its weight picked.
    let mut object = object;
    if relay.host == "gateway" && !objects.gateway_decision.is_empty() {
        for (i, l) in objects.gateway_decision.iter().enumerate() {
            lines.insert(1 + i, l.clone());
        }
        object = objects
            .gateway_decision
            .iter()
            .find_map(|l| l.strip_prefix("backend "))
            .and_then(|b| b.split(':').next())
            .map(|s| format!("Service {s}"));
    }
    // The L7 load balancer's routing decision: the rule that leads to the NodePort it used.
    if let Some((leg, _)) = relay.attempts.last().filter(|_| relay.host == "gateway") {
        let tag = format!("(nodePort {})", leg.start.1.port());
        if let Some(rule) = objects.lb_routes.iter().find(|r| r.contains(&tag)) {
            lines.insert(1, format!("Ingress rule {rule}"));
            object = rule.split("→ ").nth(1).and_then(|s| s.split(' ').next()).map(|s| format!("Service {s}"));
        }
    }
    Step { kind: "relay".into(), text: lines.join("\n"), rule: None, object }
}

/// Why a request that got no answer stopped, from where its packets were last seen.
fn explain_failure(observed: &Observed, t: &Tuples, path: &[String], reply: &[String], objects: &Objects) -> String {
    let Some(last) = path.last() else {
        return format!("the request never left {}", observed.from);
    };
    // A reply that reached the sender from an address it did not send to is dropped there.
    if reply.last() == Some(&observed.from) {
        let expected = (observed.dst.expect("dst"), observed.src.expect("src"));
        if let Some(o) = observed.packets[&observed.from]
            .iter()
            .find(|o| o.is_syn_ack() && t.backward.contains(&(o.src, o.dst)) && (o.src, o.dst) != expected)
        {
            let who = name_of(objects, o.src.ip()).map(|n| format!(" ({n})")).unwrap_or_default();
            return format!(
                "the reply reached {} from {}{who} instead of {}: it belongs to no connection there and is dropped (no masquerade on the node that forwarded the request; reply path: {})",
                observed.from,
                o.src,
                expected.0,
                reply.join(" → ")
            );
        }
    }
    if reply.is_empty() {
        return format!("the request was last seen on {last}; no reply came back");
    }
    format!("the reply was last seen on {} (reply path: {})", reply.last().expect("non-empty"), reply.join(" → "))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::flow::{request_path, route_queries, tuples};
    use super::super::parse::{parse_conntrack, parse_monitor};
    use super::*;

    const CLIENT: &str = "PACKET: 2 a1 OUT=eth0 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=64 ID=7 DF SPORT=40000 DPORT=80 SYN \n TRACE: 2 a1 raw:OUTPUT:policy:ACCEPT \n";
    const GATEWAY: &str = "PACKET: 2 b1 IN=eth1 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=64 ID=7 DF SPORT=40000 DPORT=80 SYN \n TRACE: 2 b1 raw:PREROUTING:policy:ACCEPT \n";
    // node-3 takes it from the gateway, DNATs to a pod on node-1 and masquerades.
    const NODE3: &str = r#"PACKET: 2 c1 IN=eth0 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=63 ID=7 DF SPORT=40000 DPORT=80 SYN 
 TRACE: 2 c1 nat:PREROUTING:rule:0x1:JUMP:KUBE-SERVICES  -4 -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
 TRACE: 2 c1 nat:KUBE-SERVICES:rule:0x2:JUMP:KUBE-EXT-AAA  -4 -t nat -A KUBE-SERVICES -d 198.51.100.1/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-AAA
 TRACE: 2 c1 nat:KUBE-EXT-AAA:rule:0x3:JUMP:KUBE-MARK-MASQ  -4 -t nat -A KUBE-EXT-AAA -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ
 TRACE: 2 c1 nat:KUBE-MARK-MASQ:rule:0x4:CONTINUE  -4 -t nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
 TRACE: 2 c1 nat:KUBE-EXT-AAA:rule:0x5:JUMP:KUBE-SVC-AAA  -4 -t nat -A KUBE-EXT-AAA -j KUBE-SVC-AAA
 TRACE: 2 c1 nat:KUBE-SVC-AAA:rule:0x6:JUMP:KUBE-SEP-BBB  -4 -t nat -A KUBE-SVC-AAA -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BBB
 TRACE: 2 c1 nat:KUBE-SEP-BBB:rule:0x7:ACCEPT  -4 -t nat -A KUBE-SEP-BBB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.5:8080
PACKET: 2 c1 IN=eth0 OUT=eth0 SRC=203.0.113.10 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=62 ID=7 DF SPORT=40000 DPORT=8080 SYN MARK=0x4000 
 TRACE: 2 c1 filter:FORWARD:rule:0x8:JUMP:KUBE-PROXY-FIREWALL  -4 -t filter -A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
 TRACE: 2 c1 filter:FORWARD:rule:0x9:JUMP:KUBE-FORWARD  -4 -t filter -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
 TRACE: 2 c1 filter:KUBE-FORWARD:rule:0xa:ACCEPT  -4 -t filter -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
PACKET: 2 c1 IN=eth0 OUT=eth0 SRC=203.0.113.10 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=62 ID=7 DF SPORT=40000 DPORT=8080 SYN MARK=0x4000 
 TRACE: 2 c1 nat:POSTROUTING:rule:0xb:JUMP:KUBE-POSTROUTING  -4 -t nat -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
 TRACE: 2 c1 nat:KUBE-POSTROUTING:rule:0xc:ACCEPT  -4 -t nat -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
PACKET: 2 c2 IN=eth0 SRC=10.0.0.1 DST=10.0.0.2 LEN=60 TOS=0x0 TTL=64 ID=9 DF SPORT=1 DPORT=2 SYN 
"#;
    const NODE1: &str = "PACKET: 2 d1 IN=eth0 OUT=cni0 SRC=192.168.56.13 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=61 ID=7 DF SPORT=5555 DPORT=8080 SYN \n TRACE: 2 d1 filter:FORWARD:policy:ACCEPT \n";
    const NAT3: &str = "-A KUBE-SVC-AAA -m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BBB\n-A KUBE-SVC-AAA -m comment --comment \"default/web:http -> 10.244.2.6:8080\" -j KUBE-SEP-CCC\n";

    fn observed(client_extra: &str) -> Observed {
        let mut o = Observed {
            from: "client".into(),
            src: Some("203.0.113.10:40000".parse().unwrap()),
            dst: Some("198.51.100.1:80".parse().unwrap()),
            ..Default::default()
        };
        for (h, text) in [
            ("client", format!("{CLIENT}{client_extra}")),
            ("gateway", GATEWAY.into()),
            ("node-3", NODE3.into()),
            ("node-1", NODE1.into()),
            ("node-2", String::new()),
        ] {
            o.packets.insert(h.into(), parse_monitor(&text));
        }
        o.conntrack.insert("node-3".into(), parse_conntrack("tcp 6 119 TIME_WAIT src=203.0.113.10 dst=198.51.100.1 sport=40000 dport=80 src=10.244.1.5 dst=192.168.56.13 sport=8080 dport=5555 [ASSURED] mark=0 use=1\n"));
        o.conntrack.insert("node-1".into(), parse_conntrack("tcp 6 119 TIME_WAIT src=192.168.56.13 dst=10.244.1.5 sport=5555 dport=8080 src=10.244.1.5 dst=192.168.56.13 sport=8080 dport=5555 [ASSURED] mark=0 use=1\n"));
        o
    }

    fn objects() -> Objects {
        let mut o = Objects::default();
        o.pods.insert("10.244.1.5".parse().unwrap(), ("default/web-1".into(), "node-1".into()));
        for i in 1..=3u8 {
            o.nodes.insert(Ipv4Addr::new(192, 168, 56, 10 + i).into(), format!("node-{i}"));
        }
        o.traffic_policy.insert("default/web".into(), "Cluster".into());
        o.nat_rules.insert("node-3".into(), NAT3.into());
        o.routes.insert(
            (0, "client".into()),
            "198.51.100.1 via 203.0.113.1 dev eth0 src 203.0.113.10 uid 0\n    cache\n".into(),
        );
        o.routes.insert((0, "node-3".into()), "10.244.1.5 from 203.0.113.10 via 192.168.56.11 dev eth0\n".into());
        o.routes.insert((0, "node-1".into()), "10.244.1.5 from 192.168.56.13 dev cni0\n".into());
        o.lb = Some(("passthrough LB of default/web".into(), vec!["node-1".into(), "node-2".into(), "node-3".into()]));
        o
    }

    fn ok() -> Outcome {
        Outcome { answered: true, status: Some(200), millis: 1.5, error: None }
    }

    #[test]
    fn the_flow_is_followed_across_nat_and_hops_come_in_ttl_order() {
        let o = observed("");
        let t = tuples((o.src.unwrap(), o.dst.unwrap()), &o.conntrack);
        let fwd = |a: &str, b: &str| (a.parse().unwrap(), b.parse().unwrap());
        assert!(t.forward.contains(&fwd("203.0.113.10:40000", "10.244.1.5:8080")), "DNAT done, SNAT not yet");
        assert!(t.forward.contains(&fwd("192.168.56.13:5555", "10.244.1.5:8080")), "after masquerade");
        assert!(t.backward.contains(&fwd("10.244.1.5:8080", "192.168.56.13:5555")));
        assert_eq!(request_path(&o, &t), ["client", "gateway", "node-3", "node-1"]);
        let flow = follow(&o);
        assert_eq!((flow.legs.len(), flow.relays.len()), (1, 0), "no relay on this path");
        let q = route_queries(&o, &flow);
        assert_eq!(q[2].1.argv().join(" "), "10.244.1.5 from 203.0.113.10 iif eth0 ipproto tcp sport 40000 dport 8080");
        assert_eq!(q[0].1.argv().join(" "), "198.51.100.1 ipproto tcp sport 40000 dport 80");
    }

    #[test]
    fn each_hop_says_what_decided_it_and_which_object_caused_it() {
        let trace = assemble(&observed(""), &objects(), ok());
        let texts: Vec<Vec<String>> =
            trace.hops.iter().map(|h| h.steps.iter().map(|s| s.text.clone()).collect()).collect();
        assert_eq!(
            trace.hops.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(),
            ["client", "gateway", "node-3", "node-1"]
        );
        assert_eq!(texts[0], ["route 198.51.100.1 via 203.0.113.1 dev eth0"]);
        assert_eq!(
            texts[1],
            ["route 198.51.100.1 → node-3 (passthrough LB of default/web; node-1, node-2 also in rotation)"]
        );
        assert_eq!(
            texts[2],
            [
                "nat PREROUTING → KUBE-SERVICES\n→ KUBE-EXT-AAA \"default/web:http loadbalancer IP\"; masquerade mark (externalTrafficPolicy: Cluster)\n→ KUBE-SVC-AAA rule 1 of 2 (probability 0.5) → KUBE-SEP-BBB",
                "DNAT 10.244.1.5:8080 (pod default/web-1)",
                "nat POSTROUTING → KUBE-POSTROUTING",
                "POSTROUTING MASQUERADE → source 192.168.56.13:5555",
                "route 10.244.1.5 via 192.168.56.11 (node-1) dev eth0",
            ]
        );
        assert_eq!(
            texts[3],
            ["route 10.244.1.5 dev cni0 (directly connected)", "bridge cni0 → pod default/web-1 (10.244.1.5:8080)"]
        );
        let dnat = &trace.hops[2].steps[1];
        assert_eq!(dnat.object.as_deref(), Some("EndpointSlice endpoint of Service default/web:http"));
        assert!(dnat.rule.as_deref().is_some_and(|r| r.ends_with("-j DNAT --to-destination 10.244.1.5:8080")));
        assert_eq!(trace.pod.as_deref(), Some("default/web-1"));
        assert_eq!(trace.pod_saw.as_deref(), Some("192.168.56.13:5555"));
        assert_eq!(
            trace.conntrack,
            ["node-3: 203.0.113.10:40000→198.51.100.1:80 ⇄ 10.244.1.5:8080→192.168.56.13:5555"]
        );
        assert_eq!(trace.stopped, None);
    }

    #[test]
    fn a_reply_from_the_wrong_address_is_where_an_unmasqueraded_request_stops() {
        // node-1 got the request unmasqueraded and answered the client straight from the pod.
        let mut o = observed("PACKET: 2 e1 IN=eth0 SRC=10.244.1.5 DST=203.0.113.10 LEN=60 TOS=0x0 TTL=62 ID=0 DF SPORT=8080 DPORT=40000 SYN ACK \n");
        o.conntrack.insert("node-3".into(), parse_conntrack("tcp 6 119 SYN_RECV src=203.0.113.10 dst=198.51.100.1 sport=40000 dport=80 src=10.244.1.5 dst=203.0.113.10 sport=8080 dport=40000 mark=0 use=1\n"));
        o.conntrack.insert("node-1".into(), parse_conntrack("tcp 6 119 SYN_RECV src=203.0.113.10 dst=10.244.1.5 sport=40000 dport=8080 src=10.244.1.5 dst=203.0.113.10 sport=8080 dport=40000 mark=0 use=1\n"));
        o.packets.insert("node-1".into(), parse_monitor("PACKET: 2 d1 IN=eth0 OUT=cni0 SRC=203.0.113.10 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=61 ID=7 DF SPORT=40000 DPORT=8080 SYN \nPACKET: 2 d2 IN=cni0 SRC=10.244.1.5 DST=203.0.113.10 LEN=60 TOS=0x0 TTL=64 ID=0 DF SPORT=8080 DPORT=40000 SYN ACK \n"));
        o.packets.insert("gateway".into(), parse_monitor(&format!("{GATEWAY}PACKET: 2 b2 IN=eth0 SRC=10.244.1.5 DST=203.0.113.10 LEN=60 TOS=0x0 TTL=63 ID=0 DF SPORT=8080 DPORT=40000 SYN ACK \n")));
        let out = Outcome { answered: false, status: None, millis: 3000.0, error: Some("timed out".into()) };
        let trace = assemble(&o, &objects(), out);
        assert_eq!(trace.reply_path, ["node-1", "gateway", "client"]);
        let stopped = trace.stopped.unwrap();
        assert!(
            stopped.starts_with(
                "the reply reached client from 10.244.1.5:8080 (pod default/web-1) instead of 198.51.100.1"
            ),
            "{stopped}"
        );
    }

    #[test]
    fn relays_are_followed_by_the_probes_dscp_with_every_attempt() {
        // lb-sim on the gateway proxies to node-2's NodePort; node-2's userspace proxy tries a
        // dead pod (reset), then a pod on node-1.
        let mut o = Observed {
            from: "client".into(),
            src: Some("203.0.113.10:40000".parse().unwrap()),
            dst: Some("198.51.100.1:80".parse().unwrap()),
            ..Default::default()
        };
        let gateway = format!("{GATEWAY}PACKET: 2 b2 OUT=eth0 SRC=192.168.56.2 DST=192.168.56.12 LEN=60 TOS=0xb4 TTL=64 ID=8 DF SPORT=5000 DPORT=30097 SYN \n");
        let node2 = r#"PACKET: 2 c1 IN=eth0 SRC=192.168.56.2 DST=192.168.56.12 LEN=60 TOS=0xb4 TTL=64 ID=8 DF SPORT=5000 DPORT=30097 SYN 
 TRACE: 2 c1 nat:PREROUTING:rule:0x1:JUMP:KUBE-NODEPORT-CONTAINER  -4 -t nat -A PREROUTING -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-CONTAINER
 TRACE: 2 c1 nat:KUBE-NODEPORT-CONTAINER:rule:0x2:ACCEPT  -4 -t nat -A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment "default/cloud-nginx:http-server" -m tcp --dport 30097 -j REDIRECT --to-ports 37077
PACKET: 2 c2 OUT=cni0 SRC=10.244.2.1 DST=10.244.2.2 LEN=60 TOS=0xb4 TTL=64 ID=9 DF SPORT=6000 DPORT=80 SYN 
PACKET: 2 c3 IN=cni0 SRC=10.244.2.2 DST=10.244.2.1 LEN=40 TOS=0xb4 TTL=64 ID=0 DF SPORT=80 DPORT=6000 ACK RST 
PACKET: 2 c4 OUT=eth0 SRC=192.168.56.12 DST=10.244.1.2 LEN=60 TOS=0xb4 TTL=64 ID=10 DF SPORT=6001 DPORT=80 SYN 
"#;
        let node1 = "PACKET: 2 d1 IN=eth0 OUT=cni0 SRC=192.168.56.12 DST=10.244.1.2 LEN=60 TOS=0xb4 TTL=63 ID=10 DF SPORT=6001 DPORT=80 SYN \n";
        for (h, text) in [("client", CLIENT), ("gateway", &gateway), ("node-2", node2), ("node-1", node1)] {
            o.packets.insert(h.into(), parse_monitor(text));
        }
        o.conntrack.insert("node-2".into(), parse_conntrack("tcp 6 119 TIME_WAIT src=192.168.56.2 dst=192.168.56.12 sport=5000 dport=30097 src=192.168.56.12 dst=192.168.56.2 sport=37077 dport=5000 [ASSURED] mark=0 use=1\ntcp 6 119 TIME_WAIT src=192.168.56.12 dst=10.244.1.2 sport=6001 dport=80 src=10.244.1.2 dst=192.168.56.12 sport=80 dport=6001 [ASSURED] mark=0 use=1\n"));
        let flow = follow(&o);
        assert_eq!(flow.legs.len(), 3);
        assert_eq!(
            flow.legs.iter().map(|l| l.path.clone()).collect::<Vec<_>>(),
            [
                vec!["client".to_string(), "gateway".into()],
                vec!["gateway".into(), "node-2".into()],
                vec!["node-2".into(), "node-1".into()],
            ]
        );
        let results: Vec<&str> = flow.relays[1].attempts.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(results, ["refused (reset from 10.244.2.2:80)", "connected"]);
        assert_eq!(flow.relays[1].accepted_on, "192.168.56.12:37077".parse().unwrap());
        let q = route_queries(&o, &flow);
        let keys: Vec<(usize, &str)> = q.iter().map(|((k, h), _)| (*k, h.as_str())).collect();
        assert_eq!(
            keys,
            [(0, "client"), (1, "gateway"), (2, "node-2"), (2, "node-1")],
            "no lookup where a relay took over"
        );

        let mut objects = objects();
        objects.pods.insert("10.244.2.2".parse().unwrap(), ("default/cloud-nginx-dead".into(), "node-2".into()));
        objects.pods.insert("10.244.1.2".parse().unwrap(), ("default/cloud-nginx-1".into(), "node-1".into()));
        objects.nat_rules.insert("node-2".into(), "-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment \"default/cloud-nginx:http-server\" -m tcp --dport 30097 -j REDIRECT --to-ports 37077\n".into());
        objects.lb = Some(("nodeport LB of default/cloud-nginx".into(), vec!["node-1".into(), "node-2".into()]));
        objects.routes.clear();
        let trace = assemble(&o, &objects, ok());
        assert_eq!(
            trace.hops.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(),
            ["client", "gateway", "node-2", "node-1"]
        );
        let relay = |h: usize| trace.hops[h].steps.iter().find(|s| s.kind == "relay").unwrap().text.clone();
        assert_eq!(
            relay(1),
            "lb-sim (nodeport LB of default/cloud-nginx) accepted on 198.51.100.1:80\nconnection: 192.168.56.2:5000 → 192.168.56.12:30097 (node-2) connected; node-1 also in rotation"
        );
        assert_eq!(
            relay(2),
            "node-agent's userspace proxy for default/cloud-nginx:http-server accepted on 192.168.56.12:37077\n\
             attempt 1: 10.244.2.1:6000 → 10.244.2.2:80 (pod default/cloud-nginx-dead) refused (reset from 10.244.2.2:80)\n\
             attempt 2: 192.168.56.12:6001 → 10.244.1.2:80 (pod default/cloud-nginx-1) connected"
        );
        let redirect = trace.hops[2].steps.iter().find(|s| s.kind == "dnat").unwrap();
        assert_eq!(redirect.object.as_deref(), Some("Service default/cloud-nginx:http-server"));
        assert!(redirect.text.starts_with("REDIRECT to proxy port 37077"));
        assert_eq!(trace.pod.as_deref(), Some("default/cloud-nginx-1"));
        assert_eq!(trace.pod_saw.as_deref(), Some("192.168.56.12:6001"));
    }

    #[test]
    fn the_svg_draws_every_hop_in_order_with_the_path_and_the_decisive_rules() {
        let trace = assemble(&observed(""), &objects(), ok());
        let svg = super::super::render::svg(&trace);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
        let boxes: Vec<String> = root
            .children()
            .filter(|n| n.has_tag_name("g"))
            .map(|g| {
                g.descendants().find(|n| n.attribute("class") == Some("head")).unwrap().text().unwrap().to_string()
            })
            .collect();
        assert_eq!(boxes, ["1 client", "2 gateway", "3 node-3", "4 node-1", "5 pod"]);
        let arrows = root.children().filter(|n| n.has_tag_name("line") && n.attribute("marker-end").is_some()).count();
        assert_eq!(arrows, 4, "the path: one arrow between each pair of hops");
        let texts: Vec<(&str, &str)> = root
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| (n.attribute("class").unwrap_or(""), n.text().unwrap_or("")))
            .collect();
        assert!(texts.contains(&("decisive", "DNAT 10.244.1.5:8080 (pod default/web-1)")), "{texts:?}");
        assert!(texts.iter().any(|(c, t)| *c == "rule" && t.contains("--to-destination 10.244.1.5:8080")), "{texts:?}");
        assert!(texts.contains(&("ok", "answered 200 in 1.5 ms")));
        assert!(texts.iter().any(|(_, t)| t.starts_with("conntrack on node-3: ")));
        // Every line fits its box.
        assert!(texts.iter().filter(|(c, _)| *c != "title" && *c != "step").all(|(_, t)| t.chars().count() <= 42));
    }
}
