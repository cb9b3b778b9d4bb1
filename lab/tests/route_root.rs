//! Root test of `trace::route`: the route lookups a trace asks over rtnetlink answer what
//! `ip route get` answers for the same questions, in a router namespace between two others
//! (a route via a gateway, a directly connected one, a local address, a forwarded packet's
//! input lookup, IPv6, and no route at all).

use std::net::IpAddr;

use podpath_lab::trace::route::RouteQuery;
use testkit::netns::{host_state, root_or_explain, Netns};

/// The words a trace reads of an answer: its type (when not unicast), destination, gateway
/// and device.
fn essentials(answer: &str) -> Vec<String> {
    let line = answer.lines().next().unwrap_or("").trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| words.iter().position(|w| *w == key).and_then(|i| words.get(i + 1)).map(|w| w.to_string());
    let mut out: Vec<String> =
        words.iter().take_while(|w| w.parse::<IpAddr>().is_err()).map(|w| w.to_string()).collect();
    out.push(words.iter().find(|w| w.parse::<IpAddr>().is_ok()).map(|w| w.to_string()).unwrap_or_default());
    out.push(after("via").unwrap_or_default());
    out.push(after("dev").unwrap_or_default());
    out
}

#[test]
fn route_lookups_over_netlink_answer_as_ip_route_get() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let router = Netns::new("rtr");
    let left = Netns::new("rtl");
    let right = Netns::new("rtr");
    // router ⇄ left (the default route's gateway) and router ⇄ right (where a forwarded
    // packet comes in); the interfaces in the router named after it, so they are unique.
    let link = |peer: &Netns, tag: &str, ours: &str, theirs: &str| {
        let (a, b) = (format!("{tag}a"), format!("{tag}b"));
        router.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        router.ip(&["link", "set", &b, "netns", &peer.name]);
        router.ip(&["addr", "add", ours, "dev", &a]);
        router.ip(&["link", "set", &a, "up"]);
        peer.ip(&["addr", "add", theirs, "dev", &b]);
        peer.ip(&["link", "set", &b, "up"]);
        a
    };
    let to_left = link(&left, "ppl", "192.0.2.1/24", "192.0.2.2/24");
    let from_right = link(&right, "ppr", "198.51.100.254/24", "198.51.100.7/24");
    router.ip(&["-6", "addr", "add", "2001:db8:2::1/64", "dev", &to_left, "nodad"]);
    router.ip(&["route", "add", "default", "via", "192.0.2.2"]);
    router.ip(&["-6", "route", "add", "2001:db8:99::/64", "via", "2001:db8:2::2", "dev", &to_left]);
    router.ip(&["route", "add", "10.244.1.0/24", "via", "192.0.2.2", "dev", &to_left]);
    router.run(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);

    let q = |dst: &str, from: Option<(&str, &str)>| RouteQuery {
        dst: dst.parse().unwrap(),
        from: from.map(|(s, i)| (s.parse().unwrap(), i.to_string())),
        sport: 40000,
        dport: 8080,
    };
    let cases = [
        q("203.0.113.9", None),
        q("192.0.2.2", None),
        q("192.0.2.1", None),
        q("10.244.1.5", Some(("198.51.100.7", from_right.as_str()))),
        q("2001:db8:99::5", None),
    ];
    let mut answers = vec![];
    for case in cases {
        let mut argv = vec!["ip", "route", "get"];
        let args = case.argv();
        argv.extend(args.iter().map(String::as_str));
        let (ok, ip_says) = router.run(&argv);
        assert!(ok, "ip route get {args:?}: {ip_says}");
        let asked = case.clone();
        let ours = router.in_thread(move || asked.ask()).unwrap_or_else(|| panic!("no answer to {case:?}"));
        assert_eq!(essentials(&ours), essentials(&ip_says), "{case:?}\nours: {ours}ip:   {ip_says}");
        answers.push(ours);
    }
    assert!(answers[0].starts_with("203.0.113.9 via 192.0.2.2 dev ppla"), "{answers:?}");
    assert!(answers[1].starts_with("192.0.2.2 dev ppla"), "{answers:?}");
    assert!(answers[2].starts_with("local 192.0.2.1 dev lo"), "{answers:?}");
    assert!(answers[3].starts_with("10.244.1.5 from 198.51.100.7 via 192.0.2.2 dev ppla"), "{answers:?}");
    // As `ip` prints it for IPv6: the source of the lookup (none given) as `from ::`.
    assert!(answers[4].starts_with("2001:db8:99::5 from :: via 2001:db8:2::2 dev ppla"), "{answers:?}");
    // No route (IPv6 has only the prefix above and the connected one): no answer, as `ip` fails.
    let none = q("2001:db8:77::1", None);
    let (ok, _) = router.run(&["ip", "route", "get", "2001:db8:77::1"]);
    assert!(!ok, "the fixture has no such route");
    assert_eq!(router.in_thread(move || none.ask()), None);
    // An interface that is not there: no answer.
    let missing = q("10.244.1.5", Some(("198.51.100.7", "no-such-if")));
    assert_eq!(router.in_thread(move || missing.ask()), None);

    drop((router, left, right));
    assert_eq!(host_state(), before, "the host namespace changed");
}
