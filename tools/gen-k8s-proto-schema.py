#!/usr/bin/env python3
"""Generates api/src/protobuf_schema.rs: the Kubernetes protobuf field table that
api::protobuf uses to turn protobuf request bodies (kubectl's typed clients send them) into
JSON.

Field numbers and wire types come from the prost code of the `k8s-pb` crate; JSON field names
come from the serde code of `k8s-openapi` (same snake_case Rust names on both sides). Both
crates are read from the local cargo registry:

    (cd /tmp && cargo new -q pbgen && cd pbgen && cargo add -q k8s-pb@0.9 && cargo fetch -q)
    python3 tools/gen-k8s-proto-schema.py > api/src/protobuf_schema.rs
"""
import glob
import os
import re
import sys

REG = os.path.expanduser("~/.cargo/registry/src")
PB = sorted(glob.glob(f"{REG}/*/k8s-pb-0.9.0/src"))[-1]
OA = sorted(glob.glob(f"{REG}/*/k8s-openapi-0.29.0/src/v1_33"))[-1]

# The API groups podpath serves: every object kind of them (a message with an ObjectMeta
# `metadata`) is decoded, so serving another kind of these groups needs no new table (the decoder
# refuses kinds the server does not serve).
GROUPS = ["core.v1", "apps.v1", "autoscaling.v2", "batch.v1", "coordination.v1", "discovery.v1", "networking.v1", "rbac.v1", "storage.v1"]
# Request bodies that are not objects of a served kind: DeleteOptions (kubectl drain's DELETE
# sends it), the pods/eviction subresource's Eviction (drain's POST), and the self-reviews
# `kubectl auth whoami|can-i` create.
OPTIONS = ["meta.v1.DeleteOptions", "policy.v1.Eviction", "authentication.v1.SelfSubjectReview",
           "authorization.v1.SelfSubjectAccessReview", "authorization.v1.SelfSubjectRulesReview",
           "authentication.v1.TokenRequest", "autoscaling.v1.HorizontalPodAutoscaler"]
# Messages with a JSON form of their own (handled by the decoder, not the table).
SPECIAL = {"util.intstr.IntOrString", "api.resource.Quantity", "meta.v1.Time", "meta.v1.MicroTime",
           "runtime.RawExtension", "meta.v1.Duration", "meta.v1.FieldsV1"}

def package_of(path):
    rel = os.path.relpath(os.path.dirname(path), PB).split(os.sep)
    # api/core/v1 -> core.v1 ; apimachinery/pkg/apis/meta/v1 -> meta.v1 ; apimachinery/pkg/util/intstr -> util.intstr
    if rel[0] == "api":
        return ".".join(rel[1:])
    if rel[:3] == ["apimachinery", "pkg", "apis"]:
        return ".".join(rel[3:])
    if rel[:2] == ["apimachinery", "pkg"]:
        return ".".join(rel[2:])
    return ".".join(rel)

FIELD = re.compile(r'#\[prost\(([^)]*)\)\]\s*(?:///[^\n]*\n\s*)*pub (r#)?(\w+):\s*([^\n]+),\n')
STRUCT = re.compile(r'pub struct (\w+) \{(.*?)\n\}', re.S)

messages = {}
for path in glob.glob(f"{PB}/**/mod.rs", recursive=True):
    pkg = package_of(path)
    src = open(path).read()
    for name, body in STRUCT.findall(src):
        # Join continuation lines (types that rustfmt split over several lines).
        lines = []
        for line in body.split("\n"):
            t = line.strip()
            if lines and not (t.startswith("///") or t.startswith("#[") or t.startswith("pub ") or t == ""):
                lines[-1] += " " + t
            else:
                lines.append(line)
        body = "\n".join(lines)
        fields = []
        for attrs, _raw, fname, ftype in FIELD.findall(body + "\n"):
            tag = int(re.search(r'tag = "(\d+)"', attrs).group(1))
            kind = attrs.split(",")[0].strip()
            if kind.startswith("bytes"):
                kind = "bytes"
            repeated = "repeated" in attrs
            target = None
            if kind == "message":
                # (A type rustfmt split over lines keeps a trailing comma once joined.)
                t = re.sub(r"::core::option::Option<|::prost::alloc::vec::Vec<|>", "", ftype).strip().rstrip(",").strip()
                parts = [p for p in t.split("::") if p not in ("super", "")]
                tname = parts[-1]
                if len(parts) > 1:
                    # a path like apimachinery::pkg::apis::meta::v1::ObjectMeta
                    segs = parts[:-1]
                    if segs[0] == "api":
                        tpkg = ".".join(segs[1:])
                    elif segs[:3] == ["apimachinery", "pkg", "apis"]:
                        tpkg = ".".join(segs[3:])
                    elif segs[:2] == ["apimachinery", "pkg"]:
                        tpkg = ".".join(segs[2:])
                    else:
                        tpkg = ".".join(segs)
                else:
                    tpkg = pkg
                target = f"{tpkg}.{tname}"
            elif kind.endswith("map") or kind.startswith("btree_map") or kind.startswith("map"):
                m = re.search(r'map\s*=\s*"(\w+),\s*(\w+)"', attrs)
                kind = "map"
                target = m.group(2)  # value kind: string / bytes / message
                if target == "message":
                    vt = re.search(r"BTreeMap<\s*[^,]+,\s*([^>]+)>", ftype).group(1).strip().rstrip(",").strip()
                    segs = [p for p in vt.split("::") if p not in ("super", "")]
                    if segs[0] == "api":
                        vpkg = ".".join(segs[1:-1])
                    elif segs[:3] == ["apimachinery", "pkg", "apis"]:
                        vpkg = ".".join(segs[3:-1])
                    elif segs[:2] == ["apimachinery", "pkg"]:
                        vpkg = ".".join(segs[2:-1])
                    else:
                        vpkg = pkg
                    target = "msg:" + (vpkg or pkg) + "." + segs[-1]
            fields.append((tag, fname, kind, repeated, target))
        messages[f"{pkg}.{name}"] = fields

# snake_case -> JSON names from k8s-openapi's deserializers.
json_names = {}
for path in glob.glob(f"{OA}/**/*.rs", recursive=True):
    for js, snake in re.findall(r'"([A-Za-z0-9$]+)" => Field::Key_(\w+)', open(path).read()):
        json_names.setdefault(snake, js)
json_names.update({"type": "type", "r#type": "type"})

# Which fields are optional (Option<…>) in k8s-openapi, per (package, struct): protobuf carries
# Go's empty strings for unset optional fields, JSON would omit them.
optional = {}
for path in glob.glob(f"{OA}/**/*.rs", recursive=True):
    rel = os.path.relpath(os.path.dirname(path), OA).split(os.sep)
    if rel[0] == "api":
        pkg = ".".join(rel[1:])
    elif rel[:3] == ["apimachinery", "pkg", "apis"]:
        pkg = ".".join(rel[3:])
    else:
        continue
    for name, body in STRUCT.findall(open(path).read()):
        for fname, ftype in re.findall(r'pub (?:r#)?(\w+):\s*([^\n]+),', body):
            optional[(pkg, name, fname)] = ftype.strip().startswith("Option<")

def json_name(snake):
    if snake in json_names:
        return json_names[snake]
    parts = snake.split("_")
    return parts[0] + "".join(p.capitalize() for p in parts[1:])

roots = sorted(m for m, fields in messages.items()
               if m.rsplit(".", 1)[0] in GROUPS and any(f[1] == "metadata" and f[4] == "meta.v1.ObjectMeta" for f in fields))
reachable, todo = [], roots + OPTIONS
while todo:
    m = todo.pop()
    if m in reachable or m in SPECIAL:
        continue
    if m not in messages:
        sys.exit(f"unknown message {m}")
    reachable.append(m)
    for tag, fname, kind, rep, target in messages[m]:
        if kind == "message":
            todo.append(target)
        elif kind == "map" and target and target.startswith("msg:"):
            todo.append(target[4:])

out = ["// @generated by tools/gen-k8s-proto-schema.py from the k8s-pb 0.9.0 and k8s-openapi 0.29.0",
       "// crates (protobuf field numbers of Kubernetes v1.33 and their JSON names). Do not edit.",
       "",
       "use crate::protobuf::{Field, Kind::*, Message};",
       "",
       "pub static MESSAGES: &[Message] = &["]
for m in sorted(reachable):
    out.append(f'    Message {{ name: "{m}", fields: &[')
    pkg, mname = m.rsplit(".", 1)
    for tag, fname, kind, rep, target in sorted(messages[m]):
        js = json_name(fname)
        if kind == "message":
            k = f'Msg("{target}")'
        elif kind == "map":
            if target == "string":
                k = "MapString"
            elif target == "bytes":
                k = "MapBytes"
            else:
                k = f'MapMsg("{target[4:]}")'
        else:
            k = {"string": "Str", "int32": "I32", "int64": "I64", "bool": "Bool", "bytes": "Bytes",
                 "double": "F64", "float": "F32"}[kind]
        omit = optional.get((pkg, mname, fname.replace("r#", "")), optional.get((pkg, mname, fname + "_"), True))
        out.append(f'        Field {{ tag: {tag}, json: "{js}", kind: {k}, repeated: {"true" if rep else "false"}, omit_empty: {"true" if omit else "false"} }},')
    out.append("    ] },")
out.append("];")
print("\n".join(out))
