//! The OpenAPI v2 document in protobuf, as kube-apiserver serves `/openapi/v2` to a client that
//! asks for `application/com.github.proto-openapi.spec.v2@v1.0+protobuf` (kubectl does, to
//! validate a `kind: List` on the client side): gnostic's `openapi.v2.Document` written from
//! the JSON document, field by field. Pure. Extension and example values are written as
//! gnostic writes them, as YAML text in `Any.yaml` (JSON is YAML, so the JSON text).
//!
//! Written by hand (a protobuf writer of a few lines and the field numbers of gnostic's
//! `OpenAPIv2.proto`): generating the message types would add a build step and ~80 types for
//! one conversion of one document.

use serde_json::{Map, Value};

/// The media type kubectl asks for (an `@`, which is not a valid media type character) …
pub const MEDIA_TYPE_ASKED: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// … and the one the server answers with, as kube-apiserver does (Go's mime parser refuses the
/// `@`), also accepted when asked for.
pub const MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// A protobuf message being written.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// A string field, left out when absent (proto3: empty is the default).
    fn str(&mut self, field: u32, v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str).filter(|s| !s.is_empty()) {
            self.bytes(field, s.as_bytes());
        }
    }

    fn strs(&mut self, field: u32, v: Option<&Value>) {
        for s in v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            self.bytes(field, s.as_bytes());
        }
    }

    fn boolean(&mut self, field: u32, v: Option<&Value>) {
        if v.and_then(Value::as_bool) == Some(true) {
            self.key(field, 0);
            self.varint(1);
        }
    }

    fn int(&mut self, field: u32, v: Option<&Value>) {
        if let Some(n) = v.and_then(Value::as_i64).filter(|n| *n != 0) {
            self.key(field, 0);
            self.varint(n as u64);
        }
    }

    fn double(&mut self, field: u32, v: Option<&Value>) {
        if let Some(n) = v.and_then(Value::as_f64).filter(|n| *n != 0.0) {
            self.key(field, 1);
            self.0.extend_from_slice(&n.to_le_bytes());
        }
    }

    fn msg(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }
}

/// `Any { yaml }`.
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.bytes(2, serde_json::to_string(v).unwrap_or_default().as_bytes());
    m
}

/// The `x-…` keys of an object, as `repeated NamedAny`.
fn extensions(m: &mut Msg, field: u32, obj: &Map<String, Value>) {
    for (k, v) in obj.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Msg::default();
        named.bytes(1, k.as_bytes());
        named.msg(2, any(v));
        m.msg(field, named);
    }
}

fn schema(v: &Value) -> Msg {
    let mut m = Msg::default();
    let Some(o) = v.as_object() else { return m };
    m.str(1, o.get("$ref"));
    m.str(2, o.get("format"));
    m.str(3, o.get("title"));
    m.str(4, o.get("description"));
    if let Some(d) = o.get("default") {
        m.msg(5, any(d));
    }
    m.double(6, o.get("multipleOf"));
    m.double(7, o.get("maximum"));
    m.boolean(8, o.get("exclusiveMaximum"));
    m.double(9, o.get("minimum"));
    m.boolean(10, o.get("exclusiveMinimum"));
    m.int(11, o.get("maxLength"));
    m.int(12, o.get("minLength"));
    m.str(13, o.get("pattern"));
    m.int(14, o.get("maxItems"));
    m.int(15, o.get("minItems"));
    m.boolean(16, o.get("uniqueItems"));
    m.int(17, o.get("maxProperties"));
    m.int(18, o.get("minProperties"));
    m.strs(19, o.get("required"));
    for e in o.get("enum").and_then(Value::as_array).into_iter().flatten() {
        m.msg(20, any(e));
    }
    match o.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut a = Msg::default();
            a.key(2, 0);
            a.varint(*b as u64);
            m.msg(21, a);
        }
        Some(s @ Value::Object(_)) => {
            let mut a = Msg::default();
            a.msg(1, schema(s));
            m.msg(21, a);
        }
        _ => {}
    }
    match o.get("type") {
        Some(Value::String(t)) => {
            let mut ty = Msg::default();
            ty.bytes(1, t.as_bytes());
            m.msg(22, ty);
        }
        Some(Value::Array(ts)) => {
            let mut ty = Msg::default();
            ty.strs(1, Some(&Value::Array(ts.clone())));
            m.msg(22, ty);
        }
        _ => {}
    }
    match o.get("items") {
        Some(Value::Array(items)) => {
            let mut it = Msg::default();
            items.iter().for_each(|s| it.msg(1, schema(s)));
            m.msg(23, it);
        }
        Some(s @ Value::Object(_)) => {
            let mut it = Msg::default();
            it.msg(1, schema(s));
            m.msg(23, it);
        }
        _ => {}
    }
    for s in o.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        m.msg(24, schema(s));
    }
    if let Some(props) = o.get("properties").and_then(Value::as_object) {
        let mut p = Msg::default();
        for (name, s) in props {
            p.msg(1, named(name, schema(s)));
        }
        m.msg(25, p);
    }
    m.str(26, o.get("discriminator"));
    m.boolean(27, o.get("readOnly"));
    if let Some(e) = o.get("example") {
        m.msg(30, any(e));
    }
    extensions(&mut m, 31, o);
    m
}

/// `Named… { name, value }`.
fn named(name: &str, value: Msg) -> Msg {
    let mut n = Msg::default();
    n.bytes(1, name.as_bytes());
    n.msg(2, value);
    n
}

/// A parameter: a body parameter, or a query/path/header/formData one (each its own message
/// with its own numbers), or a `$ref`.
fn parameter(p: &Value) -> Msg {
    let mut item = Msg::default();
    let Some(o) = p.as_object() else { return item };
    if let Some(r) = o.get("$ref") {
        let mut j = Msg::default();
        j.str(1, Some(r));
        item.msg(2, j);
        return item;
    }
    let mut param = Msg::default();
    if o.get("in").and_then(Value::as_str) == Some("body") {
        let mut b = Msg::default();
        b.str(1, o.get("description"));
        b.str(2, o.get("name"));
        b.str(3, o.get("in"));
        b.boolean(4, o.get("required"));
        if let Some(s) = o.get("schema") {
            b.msg(5, schema(s));
        }
        extensions(&mut b, 6, o);
        param.msg(1, b);
    } else {
        // (field of NonBodyParameter, number of `type`, of `uniqueItems`, of the extensions)
        let (which, ty, unique, ext) = match o.get("in").and_then(Value::as_str) {
            Some("header") => (1, 5, 19, 22),
            Some("formData") => (2, 6, 20, 23),
            Some("path") => (4, 5, 19, 22),
            _ => (3, 6, 20, 23),
        };
        let mut s = Msg::default();
        s.boolean(1, o.get("required"));
        s.str(2, o.get("in"));
        s.str(3, o.get("description"));
        s.str(4, o.get("name"));
        s.str(ty, o.get("type"));
        s.boolean(unique, o.get("uniqueItems"));
        extensions(&mut s, ext, o);
        let mut nb = Msg::default();
        nb.msg(which, s);
        param.msg(2, nb);
    }
    item.msg(1, param);
    item
}

fn operation(v: &Value) -> Msg {
    let mut m = Msg::default();
    let Some(o) = v.as_object() else { return m };
    m.strs(1, o.get("tags"));
    m.str(2, o.get("summary"));
    m.str(3, o.get("description"));
    m.str(5, o.get("operationId"));
    m.strs(6, o.get("produces"));
    m.strs(7, o.get("consumes"));
    for p in o.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        m.msg(8, parameter(p));
    }
    if let Some(rs) = o.get("responses").and_then(Value::as_object) {
        let mut responses = Msg::default();
        for (code, r) in rs {
            let mut resp = Msg::default();
            resp.str(1, r.get("description"));
            if let Some(s) = r.get("schema") {
                let mut item = Msg::default();
                item.msg(1, schema(s));
                resp.msg(2, item);
            }
            let mut value = Msg::default();
            value.msg(1, resp);
            responses.msg(1, named(code, value));
        }
        m.msg(9, responses);
    }
    m.strs(10, o.get("schemes"));
    m.boolean(11, o.get("deprecated"));
    extensions(&mut m, 13, o);
    m
}

/// The whole document.
pub fn encode_v2(doc: &Value) -> Vec<u8> {
    let mut d = Msg::default();
    let Some(o) = doc.as_object() else { return d.0 };
    d.str(1, o.get("swagger"));
    if let Some(info) = o.get("info") {
        let mut i = Msg::default();
        i.str(1, info.get("title"));
        i.str(2, info.get("version"));
        i.str(3, info.get("description"));
        d.msg(2, i);
    }
    d.str(3, o.get("host"));
    d.str(4, o.get("basePath"));
    d.strs(5, o.get("schemes"));
    d.strs(6, o.get("consumes"));
    d.strs(7, o.get("produces"));
    if let Some(paths) = o.get("paths").and_then(Value::as_object) {
        let mut ps = Msg::default();
        for (path, item) in paths {
            let mut pi = Msg::default();
            for (method, field) in
                [("get", 2), ("put", 3), ("post", 4), ("delete", 5), ("options", 6), ("head", 7), ("patch", 8)]
            {
                if let Some(op) = item.get(method) {
                    pi.msg(field, operation(op));
                }
            }
            for p in item.get("parameters").and_then(Value::as_array).into_iter().flatten() {
                pi.msg(9, parameter(p));
            }
            if let Some(obj) = item.as_object() {
                extensions(&mut pi, 10, obj);
            }
            ps.msg(2, named(path, pi));
        }
        d.msg(8, ps);
    }
    if let Some(defs) = o.get("definitions").and_then(Value::as_object) {
        let mut ds = Msg::default();
        for (name, s) in defs {
            ds.msg(1, named(name, schema(s)));
        }
        d.msg(9, ds);
    }
    extensions(&mut d, 16, o);
    d.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Reads a message's fields: (number, wire type, payload) — varints as their value in
    /// eight bytes, length-delimited as their bytes.
    fn fields(mut b: &[u8]) -> Vec<(u32, u8, Vec<u8>)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= ((byte & 0x7f) as u64) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = vec![];
        while !b.is_empty() {
            let key = varint(&mut b);
            let (field, wire) = ((key >> 3) as u32, (key & 7) as u8);
            match wire {
                0 => out.push((field, wire, varint(&mut b).to_le_bytes().to_vec())),
                1 => {
                    out.push((field, wire, b[..8].to_vec()));
                    b = &b[8..];
                }
                2 => {
                    let n = varint(&mut b) as usize;
                    out.push((field, wire, b[..n].to_vec()));
                    b = &b[n..];
                }
                _ => panic!("wire type {wire}"),
            }
        }
        out
    }

    fn field(b: &[u8], n: u32) -> Vec<u8> {
        fields(b).into_iter().find(|f| f.0 == n).unwrap_or_else(|| panic!("field {n}")).2
    }

    #[test]
    fn a_document_in_gnostics_numbers() {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": {"/api/v1/namespaces/{namespace}/pods/{name}": {"patch": {
                "consumes": ["application/apply-patch+yaml"],
                "parameters": [{"name": "fieldManager", "in": "query", "type": "string", "uniqueItems": true},
                               {"name": "body", "in": "body", "required": true, "schema": {"type": "object"}}],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-group-version-kind": {"group": "", "version": "v1", "kind": "Pod"}}}},
            "definitions": {"io.k8s.api.core.v1.Pod": {
                "type": "object",
                "required": ["spec"],
                "properties": {"spec": {"$ref": "#/definitions/io.k8s.api.core.v1.PodSpec"},
                               "ports": {"type": "array", "items": {"type": "integer", "format": "int32"}},
                               "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
                "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}]}}
        });
        let b = encode_v2(&doc);
        assert_eq!(field(&b, 1), b"2.0");
        assert_eq!(field(&field(&b, 2), 2), b"v1.32.0");
        // definitions → NamedSchema → Schema
        let named = field(&field(&b, 9), 1);
        assert_eq!(field(&named, 1), b"io.k8s.api.core.v1.Pod");
        let pod = field(&named, 2);
        assert_eq!(field(&field(&pod, 22), 1), b"object");
        assert_eq!(field(&pod, 19), b"spec");
        let ext = field(&pod, 31);
        assert_eq!(field(&ext, 1), b"x-kubernetes-group-version-kind");
        assert_eq!(field(&field(&ext, 2), 2), br#"[{"group":"","kind":"Pod","version":"v1"}]"#);
        let props: Vec<Vec<u8>> = fields(&field(&pod, 25)).into_iter().map(|f| f.2).collect();
        let names: Vec<Vec<u8>> = props.iter().map(|p| field(p, 1)).collect();
        assert_eq!(names, [b"labels".to_vec(), b"ports".to_vec(), b"spec".to_vec()]);
        let labels = field(&props[0], 2);
        assert_eq!(field(&field(&field(&field(&labels, 21), 1), 22), 1), b"string");
        let ports = field(&props[1], 2);
        assert_eq!(field(&field(&field(&ports, 23), 1), 2), b"int32");
        assert_eq!(field(&field(&props[2], 2), 1), b"#/definitions/io.k8s.api.core.v1.PodSpec");
        // paths → NamedPathItem → PathItem.patch (8) → Operation
        let op = field(&field(&field(&field(&b, 8), 2), 2), 8);
        let params: Vec<Vec<u8>> = fields(&op).into_iter().filter(|f| f.0 == 8).map(|f| f.2).collect();
        let query = field(&field(&field(&params[0], 1), 2), 3);
        assert_eq!((field(&query, 4), field(&query, 6)), (b"fieldManager".to_vec(), b"string".to_vec()));
        let body = field(&field(&params[1], 1), 1);
        assert_eq!(field(&body, 3), b"body");
        assert_eq!(field(&field(&field(&op, 9), 1), 1), b"200");
        assert_eq!(field(&field(&op, 13), 1), b"x-kubernetes-group-version-kind");
    }
}
