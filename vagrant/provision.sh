#!/usr/bin/env bash
# Provisions one machine of the Vagrant lab: `provision.sh ROLE` with ROLE control-plane, node,
# gateway or client; the rest comes from the environment the Vagrantfile sets (LAB_*).
#
# One self-contained script because Vagrant's shell provisioner uploads only the script itself.
# It works offline (the binaries were uploaded by the file provisioner; apt runs only if a tool
# is missing), is idempotent (re-running changes nothing and restarts a service only when its
# binary or command line changed), and runs services under systemd when the machine has it or
# as background processes when it does not, so the same script is tested without VMs.
set -euo pipefail

ROLE=${1:?usage: provision.sh control-plane|node|gateway|client}
: "${LAB_NAME:?}" "${LAB_IP:?}" "${LAB_HOSTS:?}" "${LAB_CONTROL_PLANE:?}" "${LAB_GATEWAY:?}"
: "${LAB_GATEWAY_EXTERNAL:?}" "${LAB_NODE_NET:?}" "${LAB_CLIENT_NET:?}"
LAB_PROXY_MODE=${LAB_PROXY_MODE:-iptables}
LAB_NFTABLES_LAYOUT=${LAB_NFTABLES_LAYOUT:-current}
LAB_LB_MODE=${LAB_LB_MODE:-passthrough}
LAB_MASQUERADE=${LAB_MASQUERADE:-true}
LAB_REGISTRY_MIRRORS=${LAB_REGISTRY_MIRRORS:-}
LAB_HOST_PROGRAMS=${LAB_HOST_PROGRAMS:-false}
LAB_UPLOAD_DIR=${LAB_UPLOAD_DIR:-/tmp/podpath-bin}
LAB_CREDENTIALS_DIR=${LAB_CREDENTIALS_DIR:-/tmp/podpath-credentials}
BIN=/usr/local/bin
CNI_BIN=/opt/cni/bin
ETC=/etc/podpath
RUN=/run/podpath
LOGS=/var/log/podpath
API_PORT=6443
GRPC_PORT=6444
# The API server's Service range (its default); the nodes' proxy drops unallocated ClusterIPs in it.
SERVICE_CIDR=10.96.0.0/12
# kubeadm's cluster DNS address (the tenth of the Service range), and the pod network.
CLUSTER_DNS=10.96.0.10
CLUSTER_CIDR=10.244.0.0/16
# The lab CA (its key only on the control plane, in the API server's cert directory) and token.
PKI=$ETC/pki
API_PKI=/var/lib/podpath/apiserver/pki
TOKEN=$ETC/token
# The node's image store and its image service (podpath up's default bound: 10 GiB).
IMAGES=/var/lib/podpath/images
IMAGES_SOCKET=$RUN/images.sock
IMAGE_STORE_LIMIT_MIB=10240

say() { echo "podpath[$ROLE]: $*"; }
# Vagrant provisions a machine on its first `up` only: the way on after a fix is said.
die() { echo "podpath[$ROLE]: error: $* (then \`vagrant provision $LAB_NAME\` goes on from here)" >&2; exit 1; }

has_systemd() { [ -d /run/systemd/system ]; }

# Installs missing Debian packages; a box that has them never touches the network.
need() { # need COMMAND PACKAGE ...
  local missing=() cmd pkg
  while [ $# -gt 0 ]; do
    cmd=$1 pkg=$2; shift 2
    command -v "$cmd" >/dev/null || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]}"
  # Boxes often ship without package lists (apt-get would know no package).
  ls /var/lib/apt/lists/*Packages* >/dev/null 2>&1 || apt-get update -q >/dev/null ||
    die "apt-get update failed (the box needs ${missing[*]}, or network access to a Debian mirror)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    die "could not install ${missing[*]} (the box needs them, or network access to a Debian mirror)"
}

CHANGED_BINARIES=()
# install_bin NAME DIR: copies an uploaded binary into place if it differs.
install_bin() {
  local src="$LAB_UPLOAD_DIR/$1" dst="$2/$1"
  [ -f "$src" ] || [ -x "$dst" ] || die "$src was not uploaded (is it in the Vagrantfile's bin_dir?)"
  [ -f "$src" ] || return 0
  if ! cmp -s "$src" "$dst"; then
    install -D -m 0755 "$src" "$dst"
    CHANGED_BINARIES+=("$1")
    say "installed $dst"
  fi
}

# install_credential NAME DEST MODE: puts an uploaded credential in place (and removes the upload,
# which sat in /tmp readable by others); a change restarts this machine's service.
CHANGED_CREDENTIALS=false
install_credential() {
  local src="$LAB_CREDENTIALS_DIR/$1" dst=$2 mode=$3
  [ -f "$src" ] || [ -f "$dst" ] || die "$src was not uploaded (the Vagrantfile uploads .vagrant/podpath/$1)"
  [ -f "$src" ] || return 0
  if ! cmp -s "$src" "$dst"; then
    install -D -m "$mode" "$src" "$dst"
    CHANGED_CREDENTIALS=true
    say "installed $dst"
  fi
  rm -f "$src"
}

# Every lab host by name, in a marked block of /etc/hosts that is replaced, never appended to.
write_hosts() {
  local block tmp
  block=$(printf '%s\n' "# podpath lab begin"; tr ',' '\n' <<<"$LAB_HOSTS"; printf '%s\n' "# podpath lab end")
  tmp=$(mktemp)
  sed '/^# podpath lab begin$/,/^# podpath lab end$/d' /etc/hosts >"$tmp"
  printf '%s\n' "$block" >>"$tmp"
  cmp -s "$tmp" /etc/hosts || cat "$tmp" >/etc/hosts # cat keeps the inode (a bind mount in some sandboxes)
  rm -f "$tmp"
}

# write_if_changed FILE: stdin into FILE; status 0 when it changed.
write_if_changed() {
  local tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if cmp -s "$tmp" "$1" 2>/dev/null; then
    rm -f "$tmp"
    return 1
  fi
  mkdir -p "$(dirname "$1")"
  mv "$tmp" "$1"
  chmod 0644 "$1"
}

# The lab's sysctls and routes, in a script that a oneshot unit re-applies at boot.
NET_SCRIPT=$ETC/net-up
write_net_script() { # stdin: the body
  {
    echo "#!/bin/sh"
    echo "# Written by podpath's vagrant/provision.sh ($ROLE): this machine's lab sysctls and routes."
    echo "set -e"
    # At boot the lab NIC may come up after this runs: retry a failing step for up to 30 s.
    # shellcheck disable=SC2016 # written for the generated script, expanded there
    echo 'retry() { for _ in $(seq 30); do "$@" 2>/dev/null && return 0; sleep 1; done; "$@"; }'
    cat
  } | write_if_changed "$NET_SCRIPT" || true
  chmod 0755 "$NET_SCRIPT"
  if ! has_systemd; then
    "$NET_SCRIPT"
  else
    unit podpath-net "[Unit]
Description=podpath lab sysctls and routes
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$NET_SCRIPT

[Install]
WantedBy=multi-user.target" || true
    systemctl enable -q podpath-net.service
    # Runs the script now too (it is idempotent), so the unit reads "active" from the start.
    systemctl restart podpath-net.service ||
      { journalctl -u podpath-net -n 10 --no-pager >&2 || true; die "$NET_SCRIPT failed"; }
  fi
}

# unit NAME TEXT: writes a systemd unit; status 0 when it changed.
unit() {
  if printf '%s\n' "$2" | write_if_changed "/etc/systemd/system/$1.service"; then
    systemctl daemon-reload
    return 0
  fi
  return 1
}

# service NAME KILLMODE COMMAND...: runs COMMAND as a service, restarted when its command line or
# one of the binaries installed in this run changed.
service() {
  local name=$1 killmode=$2; shift 2
  local cmdline changed=$CHANGED_CREDENTIALS b
  cmdline=$(printf '%q ' "$@")
  for b in "${CHANGED_BINARIES[@]}"; do
    [ "$b" = "$(basename "$1")" ] && changed=true
  done
  if has_systemd; then
    unit "podpath-$name" "[Unit]
Description=podpath $name
After=network-online.target podpath-net.service
Wants=network-online.target
# Always restart, however often: a component must come back once its peer does.
StartLimitIntervalSec=0

[Service]
ExecStart=$cmdline
Restart=always
RestartSec=1
# node-agent: pods are its children and must outlive an agent restart, as with kubelet.
KillMode=$killmode

[Install]
WantedBy=multi-user.target" && changed=true
    systemctl enable -q "podpath-$name.service"
    if $changed; then systemctl restart "podpath-$name.service"; else systemctl start "podpath-$name.service"; fi
    return 0
  fi
  # No systemd: a background process with a pid file (the record a harness stops it by).
  mkdir -p "$RUN" "$LOGS"
  printf '%s\n' "$cmdline" | write_if_changed "$ETC/$name.cmdline" && changed=true
  local pidfile=$RUN/$name.pid pid=""
  [ -f "$pidfile" ] && pid=$(cat "$pidfile")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    $changed || return 0
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  say "started $name (pid $!, log $LOGS/$name.log)"
}

# wait_http NAME URL [CODES]: waits until URL answers (with one of CODES, default any code); curl
# options in CURL_OPTS (an array), WAIT_SECONDS at most (default 20).
CURL_OPTS=()
wait_http() {
  local name=$1 url=$2 codes=${3:-} code seconds=${WAIT_SECONDS:-20}
  for _ in $(seq $((seconds * 5))); do
    code=$(curl -s "${CURL_OPTS[@]}" -o /dev/null -m 1 -w '%{http_code}' "$url" || true)
    if [ "$code" != 000 ] && { [ -z "$codes" ] || [[ " $codes " == *" $code "* ]]; }; then
      say "$name answers on $url ($code)"
      return 0
    fi
    sleep 0.2
  done
  if has_systemd; then journalctl -u "podpath-$name" -n 20 --no-pager >&2 || true; else tail -n 20 "$LOGS/$name.log" >&2 || true; fi
  die "$name does not answer on $url after $seconds s"
}

# wait_socket NAME PATH: waits for a service's Unix socket.
wait_socket() {
  local name=$1 path=$2 seconds=${WAIT_SECONDS:-20}
  for _ in $(seq $((seconds * 5))); do
    if [ -S "$path" ]; then say "$name listens on $path"; return 0; fi
    sleep 0.2
  done
  if has_systemd; then journalctl -u "podpath-$name" -n 20 --no-pager >&2 || true; else tail -n 20 "$LOGS/$name.log" >&2 || true; fi
  die "$name does not listen on $path after $seconds s"
}

# Routes to every node's pod CIDR (node-N has 10.244.N.0/24: apiserver-lite numbers them after
# the node) via that node: the control plane runs no node agent, and pods (the cluster DNS among
# them) reach the API server unmasqueraded.
pod_routes() {
  local ip name
  tr ',' '\n' <<<"$LAB_HOSTS" | while read -r ip name; do
    case "$name" in
      node-[0-9]*) echo "retry ip route replace 10.244.${name#node-}.0/24 via $ip" ;;
    esac
  done
}

control_plane() {
  need ip iproute2 curl curl
  install_bin apiserver-lite "$BIN"
  install_bin podpath "$BIN"
  install_credential ca.crt "$API_PKI/ca.crt" 0644
  install_credential ca.key "$API_PKI/ca.key" 0600
  install_credential token "$TOKEN" 0600
  write_hosts
  write_net_script < <(pod_routes)
  # TLS with the lab CA (the server signs its serving certificate with it at each start, for its
  # addresses) and the token, as `podpath up` runs it.
  service apiserver-lite control-group "$BIN/apiserver-lite" --data-dir /var/lib/podpath/apiserver \
    --listen "$LAB_IP:$API_PORT" --listen "127.0.0.1:$API_PORT" --grpc-listen "$LAB_IP:$GRPC_PORT" \
    --advertise-address "$LAB_IP:$API_PORT" --node-monitor-grace-period 10s \
    --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$CLUSTER_CIDR" \
    --cert-dir "$API_PKI" --token-file "$TOKEN"
  CURL_OPTS=(--cacert "$API_PKI/ca.crt")
  wait_http apiserver-lite "https://127.0.0.1:$API_PORT/readyz" 200
  # The cluster DNS, as kubeadm's addon phase makes it (existing objects are kept).
  "$BIN/podpath" addon dns --server "https://127.0.0.1:$API_PORT" --certificate-authority "$API_PKI/ca.crt" \
    --token-file "$TOKEN" --cluster-dns "$CLUSTER_DNS" | sed "s/^/podpath[$ROLE]: /"
  say "kubectl: server https://$LAB_IP:$API_PORT (the host's .vagrant/podpath/kubeconfig)"
}

node() {
  # nft in every proxy mode: NetworkPolicies are an nftables table.
  # crun: containers of images, as `podpath up` runs them.
  need ip iproute2 iptables iptables iptables-restore iptables curl curl nsenter util-linux conntrack conntrack \
    nft nftables crun crun
  local b m images_args=() image_flags=()
  for b in node-agent podpath-workload podpath-dns podpath-images podpath; do install_bin "$b" "$BIN"; done
  for b in podpath-bridge podpath-ipam; do install_bin "$b" "$CNI_BIN"; done
  install_credential ca.crt "$PKI/ca.crt" 0644
  install_credential token "$TOKEN" 0600
  write_hosts
  # Pods' replies to the client network go back through the gateway (the masquerade=false
  # exercise); bridged pod traffic is seen by iptables (ClusterIP hairpin on one node).
  write_net_script <<EOF
retry ip route replace $LAB_CLIENT_NET via $LAB_GATEWAY
modprobe br_netfilter 2>/dev/null || true
if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then sysctl -qw net.bridge.bridge-nf-call-iptables=1; fi
EOF
  # Each node pulls its own images (a kubelet's containerd does too), through the VM's own
  # network, before the agent that asks for them starts.
  for m in $LAB_REGISTRY_MIRRORS; do images_args+=(--registry-mirror "$m"); done
  mkdir -p "$RUN"
  service images control-group "$BIN/podpath-images" --store "$IMAGES" --socket "$IMAGES_SOCKET" \
    --store-limit-mib "$IMAGE_STORE_LIMIT_MIB" "${images_args[@]}"
  wait_socket images "$IMAGES_SOCKET"
  image_flags=(--image-store "$IMAGES" --image-service "$IMAGES_SOCKET")
  [ "$LAB_HOST_PROGRAMS" = true ] && image_flags+=(--host-programs)
  service node-agent process "$BIN/node-agent" --node-name "$LAB_NAME" --node-ip "$LAB_IP" --node-external-ip "$LAB_IP" \
    --apiserver "$LAB_CONTROL_PLANE:$GRPC_PORT" --state-dir /var/lib/podpath/node \
    --cni-conf-dir /etc/cni/net.d --cni-bin-dir "$CNI_BIN" --healthz-bind-address "$LAB_IP:10256" \
    --apiserver-ca-file "$PKI/ca.crt" --token-file "$TOKEN" \
    --heartbeat-seconds 2 --restart-backoff-seconds 1 --proxy-mode "$LAB_PROXY_MODE" \
    --nftables-layout "$LAB_NFTABLES_LAYOUT" \
    --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$CLUSTER_CIDR" "--masquerade=$LAB_MASQUERADE" \
    --cluster-dns "$CLUSTER_DNS" --cluster-domain cluster.local "${image_flags[@]}"
  # /livez answers as soon as the agent runs; Ready needs the API server, which may still be
  # starting when VMs are provisioned in parallel.
  wait_http node-agent "http://$LAB_IP:10256/livez"
}

gateway() {
  # conntrack, nft: `podpath trace --vagrant` traces here (its NAT, the nftables mode's monitor).
  need ip iproute2 iptables iptables curl curl conntrack conntrack nft nftables
  install_bin lb-sim "$BIN"
  install_bin podpath "$BIN"
  install_credential ca.crt "$PKI/ca.crt" 0644
  install_credential token "$TOKEN" 0600
  write_hosts
  # Forward only between the lab's two networks: a VM's other NIC (Vagrant's NAT) is an uplink.
  write_net_script <<EOF
sysctl -qw net.ipv4.ip_forward=1
iptables -N PODPATH-LAB-ONLY 2>/dev/null || iptables -F PODPATH-LAB-ONLY
iptables -C FORWARD -j PODPATH-LAB-ONLY 2>/dev/null || iptables -I FORWARD -j PODPATH-LAB-ONLY
dev_of() { ip -o -4 addr show | awk -v ip="\$1" '\$4 ~ "^"ip"/" {print \$2; exit}' | grep .; }
for ip in $LAB_GATEWAY $LAB_GATEWAY_EXTERNAL; do
  dev=\$(retry dev_of "\$ip") || { echo "no interface has \$ip" >&2; exit 1; }
  iptables -A PODPATH-LAB-ONLY -o "\$dev" -j RETURN
done
iptables -A PODPATH-LAB-ONLY -j REJECT --reject-with icmp-net-unreachable
EOF
  # Machines come up in parallel (libvirt), and a slow control plane (emulated CPUs) may not
  # serve yet: lb-sim gives up on an API server that stays away for 30 s, so wait for it here.
  CURL_OPTS=(--cacert "$PKI/ca.crt")
  WAIT_SECONDS=900 wait_http apiserver-lite "https://$LAB_CONTROL_PLANE:$API_PORT/readyz" 200
  CURL_OPTS=()
  service lb-sim control-group "$BIN/lb-sim" --apiserver "$LAB_CONTROL_PLANE:$GRPC_PORT" \
    --apiserver-ca-file "$PKI/ca.crt" --token-file "$TOKEN" \
    --mode "$LAB_LB_MODE" --status-listen 127.0.0.1:9900
  wait_http lb-sim http://127.0.0.1:9900/healthz 200
}

client() {
  # iptables, nft, conntrack: `podpath trace --vagrant` traces here too (podpath probes from here).
  need ip iproute2 curl curl iptables iptables conntrack conntrack nft nftables
  install_bin podpath "$BIN"
  write_hosts
  # Everything outside the client's own networks goes to the gateway, as in the all-in-one lab.
  # Two /1 routes instead of a default: they beat the management NIC's DHCP default without
  # fighting over it, and `vagrant ssh` still reaches the on-link management network.
  write_net_script <<EOF
retry ip route replace 0.0.0.0/1 via $LAB_GATEWAY_EXTERNAL
retry ip route replace 128.0.0.0/1 via $LAB_GATEWAY_EXTERNAL
EOF
}

[ "$(id -u)" = 0 ] || die "run as root (Vagrant's shell provisioner is privileged by default)"
mkdir -p "$ETC"
case "$ROLE" in
  control-plane) control_plane ;;
  node) node ;;
  gateway) gateway ;;
  client) client ;;
  *) die "unknown role $ROLE (expected control-plane, node, gateway or client)" ;;
esac
say "$LAB_NAME ready ($LAB_IP)"
