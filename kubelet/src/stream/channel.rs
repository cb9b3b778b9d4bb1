//! The WebSocket channel protocols of Kubernetes' streaming API (`channel.k8s.io` and its
//! versions; `base64.channel.k8s.io`): every message starts with its channel number. Pure.
//!
//! | protocol | error channel (3) | resize (4) | close signal (255) |
//! |---|---|---|---|
//! | `channel.k8s.io`, `v2.` | error text | — | — |
//! | `v3.` | error text | yes | — |
//! | `v4.` | `Status` JSON | yes | — |
//! | `v5.` | `Status` JSON | yes | yes: `[255, channel]` half-closes the client's stdin |

use base64::Engine;

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
pub const CLOSE: u8 = 255;

/// A negotiated channel protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proto {
    pub version: u8,
    pub base64: bool,
}

/// What exec and attach accept, best first (kubelet's order of preference is the client's).
pub const EXEC_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// What port-forward accepts: the channel protocol (one data and one error channel per port)
/// and kubectl's SPDY tunnelled in WebSocket messages.
pub const PORTFORWARD_PROTOCOLS: &[&str] = &[
    "SPDY/3.1+portforward.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// The subprotocol kubectl tunnels SPDY in.
pub const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

impl Proto {
    /// The protocol a subprotocol name stands for; no name at all means `channel.k8s.io`.
    pub fn from_name(name: Option<&str>) -> Option<Proto> {
        let name = name.unwrap_or("channel.k8s.io");
        let (version, rest) = match name.split_once('.') {
            Some((v, rest)) if v.len() == 2 && v.starts_with('v') => (v[1..].parse().ok()?, rest),
            _ => (1, name),
        };
        match rest {
            "channel.k8s.io" => Some(Proto { version, base64: false }),
            "base64.channel.k8s.io" if version != 5 => Some(Proto { version, base64: true }),
            _ => None,
        }
        .filter(|p| (1..=5).contains(&p.version))
    }

    /// Whether the error channel carries a `Status` (v4 and later) rather than text.
    pub fn status_json(self) -> bool {
        self.version >= 4
    }

    /// One message: `Ok(binary)` or `Err(text)` for base64 protocols.
    pub fn encode(self, channel: u8, data: &[u8]) -> Result<Vec<u8>, String> {
        if self.base64 {
            let mut s = String::with_capacity(1 + data.len() * 4 / 3 + 4);
            s.push((b'0' + channel) as char);
            base64::engine::general_purpose::STANDARD.encode_string(data, &mut s);
            Err(s)
        } else {
            let mut m = Vec::with_capacity(1 + data.len());
            m.push(channel);
            m.extend_from_slice(data);
            Ok(m)
        }
    }

    /// Splits a client message into its channel and payload.
    pub fn decode(self, binary: Option<&[u8]>, text: Option<&str>) -> Option<(u8, Vec<u8>)> {
        if let Some(b) = binary {
            let (&ch, rest) = b.split_first()?;
            if self.base64 {
                let ch = ch.checked_sub(b'0')?;
                return Some((ch, base64::engine::general_purpose::STANDARD.decode(rest).ok()?));
            }
            return Some((ch, rest.to_vec()));
        }
        let t = text?;
        let (&ch, rest) = t.as_bytes().split_first()?;
        if self.base64 {
            Some((ch.checked_sub(b'0')?, base64::engine::general_purpose::STANDARD.decode(rest).ok()?))
        } else {
            Some((ch, rest.to_vec()))
        }
    }
}

/// A terminal size as kubectl sends it on the resize channel (`{"Width":80,"Height":24}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The terminal sizes in a chunk of the resize channel (a stream of JSON objects).
pub fn terminal_sizes(chunk: &[u8]) -> Vec<TerminalSize> {
    serde_json::Deserializer::from_slice(chunk).into_iter::<TerminalSize>().map_while(Result::ok).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names() {
        assert_eq!(Proto::from_name(Some("v5.channel.k8s.io")), Some(Proto { version: 5, base64: false }));
        assert_eq!(Proto::from_name(Some("v4.base64.channel.k8s.io")), Some(Proto { version: 4, base64: true }));
        assert_eq!(Proto::from_name(Some("channel.k8s.io")), Some(Proto { version: 1, base64: false }));
        assert_eq!(Proto::from_name(None), Some(Proto { version: 1, base64: false }));
        assert_eq!(Proto::from_name(Some("v5.base64.channel.k8s.io")), None);
        assert_eq!(Proto::from_name(Some("v9.channel.k8s.io")), None);
        assert_eq!(Proto::from_name(Some("SPDY/3.1+portforward.k8s.io")), None);
        for p in EXEC_PROTOCOLS {
            assert!(Proto::from_name(Some(p)).is_some(), "{p}");
        }
    }

    #[test]
    fn messages_binary_and_base64() {
        let bin = Proto { version: 4, base64: false };
        assert_eq!(bin.encode(STDOUT, b"hi"), Ok(vec![1, b'h', b'i']));
        assert_eq!(bin.decode(Some(&[0, b'x']), None), Some((0, b"x".to_vec())));
        assert_eq!(bin.decode(Some(&[]), None), None);
        let b64 = Proto { version: 4, base64: true };
        assert_eq!(b64.encode(STDERR, b"hi"), Err("2aGk=".into()));
        assert_eq!(b64.decode(None, Some("0aGk=")), Some((0, b"hi".to_vec())));
        assert_eq!(b64.decode(None, Some("0!!")), None);
    }

    #[test]
    fn resize_messages() {
        assert_eq!(
            terminal_sizes(br#"{"Width":80,"Height":24}{"Width":100,"Height":30}"#),
            vec![TerminalSize { width: 80, height: 24 }, TerminalSize { width: 100, height: 30 }]
        );
        assert_eq!(terminal_sizes(b"nonsense"), vec![]);
    }
}
