//! CNI errors: the spec's well-known codes plus podpath's own (100 and up), printed as the
//! spec's error JSON on stdout.

use serde_json::json;

/// Well-known and plugin-specific error codes.
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration (the message names key and value).
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Invalid or missing environment variables (the message names them).
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure (reading stdin, the store…).
    pub const IO: u32 = 5;
    /// Content that does not decode (invalid JSON).
    pub const DECODE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin cannot serve ADD now (e.g. the pool is exhausted).
    pub const NOT_AVAILABLE: u32 = 50;
    /// An internal failure of the plugin.
    pub const INTERNAL: u32 = 100;
    /// ADD for an attachment (container id + ifname) that already has one.
    pub const DUPLICATE_ATTACHMENT: u32 = 101;
    /// ADD found no free address in a range set.
    pub const POOL_EXHAUSTED: u32 = 102;
    /// A requested address is taken or outside the ranges.
    pub const ADDRESS_UNAVAILABLE: u32 = 103;
    /// CHECK found a difference between the state and `prevResult`.
    pub const CHECK_FAILED: u32 = 104;
    /// A delegated plugin (IPAM) could not be run.
    pub const DELEGATE_FAILED: u32 = 105;
}

/// An error to report to the runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError { code, msg: msg.into(), details: String::new() }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The spec's error JSON, with the protocol version in use.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = json!({"cniVersion": cni_version, "code": self.code, "msg": self.msg});
        if !self.details.is_empty() {
            v["details"] = json!(self.details);
        }
        v
    }
}

pub type Result<T> = std::result::Result<T, CniError>;
