//! REST responses as kubectl expects them: a JSON body, `application/json`, a final newline.
//! Shared by the handlers ([`crate::rest`]) and the errors ([`crate::error`]).

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

pub fn json_response(code: StatusCode, body: &Value) -> Response {
    let mut bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes.push(b'\n');
    json_bytes_response(code, bytes)
}

/// A response of JSON already serialised (with its final newline).
pub fn json_bytes_response(code: StatusCode, bytes: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
