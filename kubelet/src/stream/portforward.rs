//! `kubectl port-forward` on the node: a connection to `localhost:PORT` inside the pod's network
//! namespace per forwarded connection, as kubelet makes it, carried over SPDY streams (a
//! `data` and an `error` stream per connection, paired by `requestID`) or WebSocket channels
//! (a data and an error channel per port).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

/// Connects to `port` on the loopback of the sandbox `pid`'s network namespace (IPv4, then
/// IPv6), from a short-lived thread that enters it; the socket keeps the namespace it was made in.
pub async fn dial(pid: i32, port: u16) -> Result<TcpStream, String> {
    let connect = move || -> Result<std::net::TcpStream, String> {
        let f = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .map_err(|e| format!("the pod's sandbox is gone: {e}"))?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("cannot enter the pod's network namespace: {e}"))?;
        let timeout = Duration::from_secs(5);
        let v4 = std::net::TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), timeout);
        let s = match v4 {
            Ok(s) => s,
            Err(e4) => std::net::TcpStream::connect_timeout(&SocketAddr::from((Ipv6Addr::LOCALHOST, port)), timeout)
                .map_err(|e6| {
                    format!(
                        "failed to connect to localhost:{port} inside the pod's network namespace, \
                         IPv4: dial tcp4 127.0.0.1:{port}: connect: {}, IPv6: dial tcp6 [::1]:{port}: connect: {}",
                        errno_text(&e4),
                        errno_text(&e6)
                    )
                })?,
        };
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(s)
    };
    let s = tokio::task::spawn_blocking(move || {
        std::thread::spawn(connect).join().unwrap_or_else(|_| Err("the dialling thread failed".into()))
    })
    .await
    .map_err(|e| e.to_string())??;
    let s = TcpStream::from_std(s).map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Go's wording for the common errors ("connection refused"), so kubectl users see what they
/// know.
fn errno_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::TimedOut => "i/o timeout".into(),
        _ => {
            let s = e.to_string();
            s.split(" (os error").next().unwrap_or(&s).to_lowercase()
        }
    }
}

/// The message on the error stream when a forward fails, kubelet's form.
pub fn forward_error(port: u16, pod: &str, uid: &str, cause: &str) -> String {
    format!("error forwarding port {port} to pod {pod}, uid {uid}: {cause}")
}

/// The ports of a WebSocket port-forward (`?ports=80,8080`, possibly repeated). Pure.
pub fn parse_ports(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "ports" || k == "port" {
            for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match p.parse::<u16>() {
                    Ok(n) if n > 0 => ports.push(n),
                    _ => return Err(format!("unable to parse \"{p}\" as a port: invalid port")),
                }
            }
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_from_the_query() {
        assert_eq!(parse_ports("ports=80,8080&ports=81").unwrap(), [80, 8080, 81]);
        assert_eq!(parse_ports("").unwrap(), Vec::<u16>::new());
        assert!(parse_ports("ports=http").unwrap_err().contains("\"http\""));
        assert!(parse_ports("ports=0").is_err());
    }

    #[test]
    fn go_style_errors() {
        let e = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(errno_text(&e), "connection refused");
        assert_eq!(
            forward_error(81, "default/web", "u1", "x"),
            "error forwarding port 81 to pod default/web, uid u1: x"
        );
    }
}
