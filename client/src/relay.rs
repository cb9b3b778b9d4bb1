//! The outgoing half of a TCP relay (the userspace proxy here, lb-sim's NodePort and L7 load
//! balancers): the connection to the backend keeps the TOS byte (DSCP) of the connection that
//! came in. Ordinary traffic has TOS 0 and is unchanged; a `podpath trace` probe carries a DSCP
//! of its own, so the kernel's trace follows it through the relay to the pod.
//!
//! An accepted socket only knows the TOS of the SYN that opened it in a namespace with
//! `net.ipv4.tcp_reflect_tos = 1` (the trace turns that on for its duration; it covers IPv6's
//! traffic class too); elsewhere the inbound TOS reads 0 and nothing is kept. For IPv6 the
//! byte is the traffic class, the same DSCP bits.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpSocket, TcpStream};

/// The TOS byte (IPv6: traffic class) of an accepted connection (0 when unknown).
pub fn inbound_tos(stream: &TcpStream) -> u32 {
    let s = socket2::SockRef::from(stream);
    match stream.local_addr() {
        Ok(a) if a.is_ipv6() => s.tclass_v6().unwrap_or(0),
        _ => s.tos_v4().unwrap_or(0),
    }
}

/// Connects to `to`, with `tos` on the connection's packets when it is not 0.
pub async fn connect_with_tos(to: SocketAddr, tos: u32) -> io::Result<TcpStream> {
    if tos == 0 {
        return TcpStream::connect(to).await;
    }
    let socket = if to.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if to.is_ipv4() {
        socket.set_tos_v4(tos)?;
    } else {
        socket2::SockRef::from(&socket).set_tclass_v6(tos)?;
    }
    socket.connect(to).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_outgoing_connection_carries_the_given_tos_and_plain_connections_none() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let marked = connect_with_tos(addr, 0xb4).await.unwrap();
        assert_eq!(socket2::SockRef::from(&marked).tos_v4().unwrap(), 0xb4);
        let plain = connect_with_tos(addr, 0).await.unwrap();
        assert_eq!(socket2::SockRef::from(&plain).tos_v4().unwrap(), 0);
        let (accepted, _) = listener.accept().await.unwrap();
        // Without tcp_reflect_tos (the host's default) an accepted socket reports 0.
        assert_eq!(inbound_tos(&accepted), 0);
    }

    #[tokio::test]
    async fn over_ipv6_the_dscp_rides_in_the_traffic_class() {
        let listener = tokio::net::TcpListener::bind("[::1]:0").await.expect("IPv6 loopback");
        let addr = listener.local_addr().unwrap();
        let marked = connect_with_tos(addr, 0xb4).await.unwrap();
        assert_eq!(socket2::SockRef::from(&marked).tclass_v6().unwrap(), 0xb4);
        let (accepted, _) = listener.accept().await.unwrap();
        assert_eq!(inbound_tos(&accepted), 0);
    }
}
