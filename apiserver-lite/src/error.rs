//! The API server's errors, mapped exactly once per protocol: to a Kubernetes `Status` for REST
//! and to a `tonic::Status` for gRPC.

use api::{Cause, Kind};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The object does not exist.
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String, kind: Option<Kind> },
    /// Create of an object whose name is taken.
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String, kind: Kind },
    /// An update carried a stale resourceVersion.
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again")]
    Conflict { resource: String, name: String, kind: Kind },
    /// Server-side apply would change fields other managers own (409 with one cause per field).
    #[error("Apply failed with {} conflict{}: {message}", causes.len(), if causes.len() == 1 { "" } else { "s" })]
    ApplyConflict { message: String, causes: Vec<Cause> },
    /// Validation failed; kubectl prints the causes.
    #[error("{kind} \"{name}\" is invalid: {}", causes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "))]
    Invalid { kind: Kind, name: String, causes: Vec<Cause> },
    /// The request's options (`CreateOptions`, `DeleteOptions`, …) are invalid (422, as the real
    /// server answers an unknown `dryRun`).
    #[error("{kind}.meta.k8s.io \"\" is invalid: {}", causes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "))]
    InvalidOptions { kind: &'static str, causes: Vec<Cause> },
    /// A request object of a kind that is not stored (TokenRequest) is invalid.
    #[error("{kind}.{group} \"{name}\" is invalid: {}", causes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "))]
    InvalidRequest { group: &'static str, kind: &'static str, name: String, causes: Vec<Cause> },
    /// A body or query that cannot be understood.
    #[error("{0}")]
    BadRequest(String),
    /// The request is understood but not allowed (protected namespace, terminating namespace).
    #[error("{resource} \"{name}\" is forbidden: {message}")]
    Forbidden { resource: String, name: String, message: String },
    /// RBAC said no: the whole message is the authorizer's (`pods "web" is forbidden: User …`).
    #[error("{message}")]
    Denied { resource: String, name: String, message: String },
    /// A watch asked for a resourceVersion older than the event log.
    #[error("too old resource version: {requested} ({current})")]
    Expired { requested: u64, current: u64 },
    /// A list's continue token whose resourceVersion is older than the event log.
    #[error("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")]
    ExpiredContinue,
    /// A patch type the server does not speak.
    #[error("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json")]
    UnsupportedMediaType,
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// No media type the client accepts is served.
    #[error("{0}")]
    NotAcceptable(String),
    #[error("Unauthorized")]
    Unauthorized,
    /// No such path.
    #[error("the server could not find the requested resource")]
    NoRoute,
    /// The request body is larger than the server accepts.
    #[error("the request body is too large: limit is {0} bytes")]
    TooLarge(usize),
    /// A range (ClusterIPs, NodePorts, LB IPs, pod CIDRs) is exhausted.
    #[error("{0}")]
    RangeFull(String),
    /// sled failed; the write was not applied.
    #[error("storage error: {0}")]
    Storage(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// Nothing to proxy to (a Service without ready endpoints, a pod without an IP).
    #[error("{0}")]
    ServiceUnavailable(String),
}

impl ApiError {
    pub fn storage(msg: impl Into<String>) -> Self {
        ApiError::Storage(msg.into())
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        ApiError::Internal(msg.into())
    }
    pub fn not_found(kind: Kind, name: &str) -> Self {
        ApiError::NotFound { resource: kind.qualified_resource(), name: name.into(), kind: Some(kind) }
    }
    pub fn invalid(kind: Kind, name: &str, causes: Vec<Cause>) -> Self {
        ApiError::Invalid { kind, name: name.into(), causes }
    }

    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => 409,
            ApiError::Invalid { .. } | ApiError::InvalidOptions { .. } | ApiError::InvalidRequest { .. } => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::Forbidden { .. } | ApiError::Denied { .. } => 403,
            ApiError::Expired { .. } | ApiError::ExpiredContinue => 410,
            ApiError::UnsupportedMediaType => 415,
            ApiError::MethodNotAllowed => 405,
            ApiError::NotAcceptable(_) => 406,
            ApiError::Unauthorized => 401,
            ApiError::TooLarge(_) => 413,
            ApiError::RangeFull(_) | ApiError::Storage(_) | ApiError::Internal(_) => 500,
            ApiError::ServiceUnavailable(_) => 503,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => "Conflict",
            ApiError::Invalid { .. } | ApiError::InvalidOptions { .. } | ApiError::InvalidRequest { .. } => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Forbidden { .. } | ApiError::Denied { .. } => "Forbidden",
            ApiError::Expired { .. } | ApiError::ExpiredContinue => "Expired",
            ApiError::UnsupportedMediaType => "UnsupportedMediaType",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::NotAcceptable(_) => "NotAcceptable",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::TooLarge(_) => "RequestEntityTooLarge",
            ApiError::RangeFull(_) | ApiError::Storage(_) | ApiError::Internal(_) => "InternalError",
            ApiError::ServiceUnavailable(_) => "ServiceUnavailable",
        }
    }

    /// The Kubernetes `Status` object for this error.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let split = |resource: &str| -> (String, String) {
            match resource.split_once('.') {
                Some((r, g)) => (r.to_string(), g.to_string()),
                None => (resource.to_string(), String::new()),
            }
        };
        match self {
            ApiError::NotFound { resource, name, .. }
            | ApiError::AlreadyExists { resource, name, .. }
            | ApiError::Conflict { resource, name, .. }
            | ApiError::Forbidden { resource, name, .. }
            | ApiError::Denied { resource, name, .. } => {
                let (r, g) = split(resource);
                let mut d = json!({"name": name, "kind": r});
                if !g.is_empty() {
                    d["group"] = json!(g);
                }
                s["details"] = d;
            }
            ApiError::Invalid { kind, name, causes } => {
                // kubectl builds its message from details (kind + name + causes), not `message`.
                s["details"] =
                    json!({"name": name, "group": kind.info().group, "kind": kind.info().name, "causes": causes});
            }
            ApiError::ApplyConflict { causes, .. } => s["details"] = json!({"causes": causes}),
            ApiError::InvalidRequest { group, kind, name, causes } => {
                s["details"] = json!({"name": name, "group": group, "kind": kind, "causes": causes});
            }
            ApiError::InvalidOptions { kind, causes } => {
                s["details"] = json!({"group": "meta.k8s.io", "kind": kind, "causes": causes});
            }
            // The real server's 404 for a path it does not serve carries empty details; kubectl
            // (`kubectl debug`) reads them.
            ApiError::NoRoute => s["details"] = json!({}),
            _ => {}
        }
        s
    }
}

impl From<sled::Error> for ApiError {
    fn from(e: sled::Error) -> Self {
        ApiError::Storage(e.to_string())
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        ApiError::Internal(format!("encoding: {e}"))
    }
}

impl From<api::Error> for ApiError {
    fn from(e: api::Error) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if matches!(self, ApiError::Storage(_) | ApiError::Internal(_)) {
            tracing::error!(error = %self, "request failed");
        }
        let code = StatusCode::from_u16(self.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        crate::response::json_response(code, &self.status())
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        use tonic::Code;
        let code = match &e {
            ApiError::NotFound { .. } | ApiError::NoRoute => Code::NotFound,
            ApiError::AlreadyExists { .. } => Code::AlreadyExists,
            ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => Code::Aborted,
            ApiError::Invalid { .. }
            | ApiError::InvalidOptions { .. }
            | ApiError::InvalidRequest { .. }
            | ApiError::BadRequest(_)
            | ApiError::UnsupportedMediaType => Code::InvalidArgument,
            ApiError::Forbidden { .. } | ApiError::Denied { .. } => Code::PermissionDenied,
            ApiError::Expired { .. } | ApiError::ExpiredContinue => Code::OutOfRange,
            ApiError::MethodNotAllowed | ApiError::NotAcceptable(_) => Code::Unimplemented,
            ApiError::Unauthorized => Code::Unauthenticated,
            ApiError::TooLarge(_) => Code::ResourceExhausted,
            ApiError::RangeFull(_) => Code::ResourceExhausted,
            ApiError::ServiceUnavailable(_) => Code::Unavailable,
            ApiError::Storage(_) | ApiError::Internal(_) => Code::Internal,
        };
        tonic::Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_status_has_kubectl_details() {
        let e = ApiError::invalid(
            Kind::Service,
            "x",
            vec![api::validation::invalid(
                &api::FieldPath::root("spec").child("ports").index(0).child("nodePort"),
                &80,
                "bad",
            )],
        );
        let s = e.status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["kind"], "Service");
        assert_eq!(s["details"]["causes"][0]["field"], "spec.ports[0].nodePort");
        assert_eq!(s["message"], "Service \"x\" is invalid: spec.ports[0].nodePort: Invalid value: 80: bad");
    }

    #[test]
    fn not_found_names_the_group() {
        let s = ApiError::not_found(Kind::EndpointSlice, "x").status();
        assert_eq!(s["details"]["kind"], "endpointslices");
        assert_eq!(s["details"]["group"], "discovery.k8s.io");
        assert_eq!(s["message"], "endpointslices.discovery.k8s.io \"x\" not found");
    }
}
