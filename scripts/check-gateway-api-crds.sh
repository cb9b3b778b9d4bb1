#!/usr/bin/env bash
# Applies the Gateway API's released CRDs, unchanged, to a throwaway apiserver-lite with the
# real kubectl, then a Gateway and an HTTPRoute (defaulted) and an HTTPRoute its CEL rules
# refuse. CI has no copy of the release files: run it by hand with either
#   scripts/check-gateway-api-crds.sh DIR/standard-install.yaml DIR/experimental-install.yaml
# or a checkout of the Gateway API repository and a tag (the release files are its
# config/crd/<channel>/gateway*.yaml, concatenated):
#   scripts/check-gateway-api-crds.sh --repo PATH v1.6.1
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/podpath-gwapi.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

if [ "${1:-}" = "--repo" ]; then
  repo=$2 tag=$3
  for ch in standard experimental; do
    out=$work/$ch-install.yaml
    : > "$out"
    for f in $(git -C "$repo" ls-tree --name-only "$tag" "config/crd/$ch/" | grep '/gateway'); do
      echo "---" >> "$out"
      git -C "$repo" show "$tag:$f" >> "$out"
    done
  done
  set -- "$work/standard-install.yaml" "$work/experimental-install.yaml"
fi
[ $# -eq 2 ] || { echo "usage: $0 STANDARD.yaml EXPERIMENTAL.yaml | --repo PATH TAG" >&2; exit 2; }

bin=$here/target/debug/apiserver-lite
[ -x "$bin" ] || (cd "$here" && cargo build -q -p apiserver-lite --bin apiserver-lite)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export KUBECONFIG=$work/kubeconfig
cat > "$KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:$port"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
KC

run_channel() {
  local file=$1 mode=$2
  rm -rf "$work/data"
  "$bin" --data-dir "$work/data" --listen "127.0.0.1:$port" --grpc-listen off --insecure-http > "$work/api.log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.1; done
  kubectl apply $mode -f "$file" > "$work/apply.log" 2> "$work/apply.err"
  kubectl wait --for condition=established crd --all --timeout=20s > /dev/null
  kubectl apply -f - <<'YAML'
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: podpath}
spec: {controllerName: podpath.dev/gateway}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web}
spec:
  gatewayClassName: podpath
  listeners: [{name: http, protocol: HTTP, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{name: web}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
YAML
  [ "$(kubectl get httproute web -o jsonpath='{.spec.parentRefs[0].kind}/{.spec.rules[0].matches[0].path.type}')" = "Gateway/PathPrefix" ]
  if kubectl apply -f - > "$work/refused.log" 2>&1 <<'YAML'; then
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bad}
spec:
  parentRefs: [{name: web}]
  rules:
  - filters: [{type: RequestRedirect, requestRedirect: {scheme: https}}]
    backendRefs: [{name: web, port: 80}]
YAML
    echo "the HTTPRoute with a redirect and backendRefs was accepted" >&2; exit 1
  fi
  grep -q "RequestRedirect filter must not be used together with backendRefs" "$work/refused.log"
  echo "$(basename "$file"): $(grep -cE "created|serverside-applied" "$work/apply.log") objects applied, defaults and CEL rules at work"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

run_channel "$1" ""
run_channel "$2" "--server-side"
