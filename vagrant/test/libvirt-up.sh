#!/usr/bin/env bash
# The Vagrant lab on real VMs, end to end: `vagrant up --provider=libvirt` with the project's
# Vagrantfile, kubectl from the host side, a LoadBalancer Service curled from the client VM,
# `vagrant provision` again, `vagrant destroy`. Prints the time of every phase.
#
# Made for a Linux machine without usable KVM (QEMU software emulation, TCG) and without
# systemd: it installs vagrant, libvirt and QEMU, builds a Debian 12 box locally (debootstrap,
# no bootloader: the VMs boot its kernel directly), and runs libvirtd, virtlogd, the VMs and
# vagrant itself inside a network namespace of its own, so the host's network namespace gets
# no bridge, address or firewall rule. About 10 minutes on 2 cores; too slow for every CI run.
#
# Usage: sudo vagrant/test/libvirt-up.sh [--keep]       (--keep: leave the lab up, print how
#        to reach it and how to remove it)
# Env:   LAB_NODES (default 2), WORK (default target/vagrant-libvirt: box, pool, Vagrant home),
#        LAB_LIBVIRT_DRIVER (default qemu; kvm where hardware virtualisation works),
#        PODPATH_FIGURES (a file the figures are appended to, as book/perf/figures.tsv).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
KEEP=false
[ "${1:-}" = --keep ] && KEEP=true
[ "$(id -u)" = 0 ] || { echo "libvirt-up.sh: run as root (it starts libvirtd and creates a namespace)" >&2; exit 1; }
WORK=${WORK:-$ROOT/target/vagrant-libvirt}
export LAB_NODES=${LAB_NODES:-2}
export LAB_LIBVIRT_DRIVER=${LAB_LIBVIRT_DRIVER:-qemu}
# The box's revision grows with its package list, so an older box is built and added again
# (under another name: vagrant-libvirt keeps a box's disk in its pool by the box's name).
BOX_REV=3
export LAB_BOX=podpath/debian12-local-r$BOX_REV
# The VMs here reach no image registry (this machine reaches package archives only): busybox
# pods run the node's programs. Pods of images on node VMs are e2e/tests/vagrant.rs's, with crun
# and a registry mirror.
export LAB_HOST_PROGRAMS=true
export VAGRANT_HOME=$WORK/vagrant.d
export VAGRANT_CHECKPOINT_DISABLE=1
NS=ppvirt-$$
BOX=$WORK/box-$BOX_REV
START=$(date +%s)
LAST=$START

phase() { # phase NAME: prints the time the previous phase took
  local now
  now=$(date +%s)
  echo "==> [$((now - START)) s, previous step $((now - LAST)) s] $*"
  LAST=$now
}
in_ns() { ip netns exec "$NS" "$@"; }
# figure NAME VALUE UNIT: prints a measured figure, and appends it to $PODPATH_FIGURES (the
# book's figures file, as the benches do) when that is set.
figure() {
  echo "figure: $1: $2 $3"
  if [ -n "${PODPATH_FIGURES:-}" ]; then
    printf '%s\t%s-core %s, Linux %s\t%s\t%s\t%s\t%s\t\n' "$(date +%F)" "$(nproc)" "$(uname -m)" "$(uname -r | cut -d- -f1)" \
      "vagrant/test/libvirt-up.sh" "$1" "$2" "$3" >>"$PODPATH_FIGURES"
  fi
}

mirror() { awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || echo http://deb.debian.org/debian; }

install_packages() {
  phase "packages: vagrant, libvirt, QEMU (TCG), debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  local qemu=()
  if ! command -v qemu-system-x86_64 >/dev/null; then
    # This image's qemu-utils comes from bookworm-backports and breaks bookworm's
    # qemu-system-common, so QEMU must come from there too (only these packages).
    local src=/etc/apt/sources.list.d/podpath-bookworm-backports.sources
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$(mirror)" >"$src"
    qemu=(qemu-system-x86/bookworm-backports qemu-system-common/bookworm-backports
      qemu-system-data/bookworm-backports seabios/bookworm-backports)
  fi
  apt-get update -qq
  apt-get install -y -qq vagrant >/dev/null
  apt-get install -y -qq --no-install-recommends libvirt-daemon-system libvirt-daemon-system-sysv \
    libvirt-daemon-driver-qemu libvirt-clients dnsmasq-base debootstrap e2fsprogs qemu-utils "${qemu[@]}" >/dev/null
  rm -f /etc/apt/sources.list.d/podpath-bookworm-backports.sources
}

build_box() {
  if [ -f "$BOX/box.img" ] && [ -f "$BOX/vmlinuz" ]; then
    phase "box: reusing $BOX"
  else
    phase "box: debootstrap Debian 12 with a kernel, systemd and sshd"
    local r=$BOX/rootfs key
    rm -rf "$BOX"
    mkdir -p "$BOX"
    debootstrap --variant=minbase \
      --include=systemd-sysv,udev,linux-image-amd64,openssh-server,sudo,ifupdown,isc-dhcp-client,iproute2,iptables,nftables,conntrack,curl,ca-certificates,netbase,kmod,procps,crun \
      bookworm "$r" "$(mirror)" >"$BOX/debootstrap.log" 2>&1 || { tail "$BOX/debootstrap.log"; exit 1; }
    phase "box: vagrant user, insecure key, network, disk image"
    echo podpath-box >"$r/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 podpath-box\n' >"$r/etc/hosts"
    echo '/dev/vda / ext4 defaults 0 1' >"$r/etc/fstab"
    mkdir -p "$r/etc/network/interfaces.d"
    printf 'source /etc/network/interfaces.d/*\nauto lo\niface lo inet loopback\nallow-hotplug eth0\niface eth0 inet dhcp\n' >"$r/etc/network/interfaces"
    chroot "$r" useradd -m -s /bin/bash vagrant
    echo 'vagrant ALL=(ALL) NOPASSWD:ALL' >"$r/etc/sudoers.d/vagrant"
    chmod 0440 "$r/etc/sudoers.d/vagrant"
    key=$(find /usr/share/rubygems-integration -path '*vagrant-*/keys/vagrant.pub' | head -n 1)
    install -d -m 0700 -o 1000 -g 1000 "$r/home/vagrant/.ssh"
    install -m 0600 -o 1000 -g 1000 "$key" "$r/home/vagrant/.ssh/authorized_keys"
    echo 'UseDNS no' >"$r/etc/ssh/sshd_config.d/podpath.conf"
    rm -f "$r"/var/cache/apt/archives/*.deb
    cp "$r"/boot/vmlinuz-* "$BOX/vmlinuz"
    cp "$r"/boot/initrd.img-* "$BOX/initrd.img"
    truncate -s 4G "$BOX/disk.raw"
    mkfs.ext4 -q -F -d "$r" "$BOX/disk.raw" # filled from the directory: no loop device, no mount
    qemu-img convert -O qcow2 "$BOX/disk.raw" "$BOX/box.img"
    rm -rf "$BOX/disk.raw" "$r"
  fi
  chmod 0755 "$WORK" "$BOX"
  chmod 0644 "$BOX/vmlinuz" "$BOX/initrd.img"
  if ! vagrant box list 2>/dev/null | grep -q "^$LAB_BOX "; then
    phase "box: vagrant box add $LAB_BOX"
    echo '{"provider": "libvirt", "format": "qcow2", "virtual_size": 4}' >"$BOX/metadata.json"
    tar -C "$BOX" -cf "$BOX/podpath.box" metadata.json box.img
    vagrant box add --name "$LAB_BOX" "$BOX/podpath.box" >/dev/null
    rm -f "$BOX/podpath.box"
  fi
  # Test-only settings Vagrant reads before the project's Vagrantfile: QEMU's plain qemu64 CPU
  # (TCG), the box's kernel booted directly, an isolated management network.
  cat >"$VAGRANT_HOME/Vagrantfile" <<EOF
Vagrant.configure("2") do |config|
  config.vm.boot_timeout = 1200
  config.vm.provider :libvirt do |lv|
    lv.cpu_mode = "custom"
    lv.cpu_model = "qemu64"
    lv.kernel = "$BOX/vmlinuz"
    lv.initrd = "$BOX/initrd.img"
    lv.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
    lv.management_network_mode = "none"
    lv.storage_pool_name = "podpath"
  end
end
EOF
}

HOST_BEFORE=""
# The host namespace's links, addresses, routes and firewall (without counters).
host_state() {
  ip -o link
  ip -o addr
  ip route
  iptables-save 2>/dev/null | { grep -v '^#' || true; } | sed 's/ \[[0-9:]*\]$//'
}

start_libvirt() {
  phase "libvirtd and virtlogd in namespace $NS"
  if [ -S /run/libvirt/libvirt-sock ] && virsh -c qemu:///system version >/dev/null 2>&1; then
    echo "libvirt-up.sh: a libvirtd is already running; this script starts its own" >&2
    exit 1
  fi
  HOST_BEFORE=$(host_state)
  ip netns add "$NS"
  in_ns ip link set lo up
  in_ns virtlogd -d -p "$WORK/virtlogd.pid"
  in_ns libvirtd -d -p "$WORK/libvirtd.pid"
  for _ in $(seq 50); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
  mkdir -p "$WORK/pool"
  virsh -q pool-define-as podpath dir --target "$WORK/pool" >/dev/null
  virsh -q pool-start podpath >/dev/null
}

cleanup() {
  local rc=$?
  set +e
  if $KEEP && [ "$rc" = 0 ]; then
    echo "the lab is up. Reach it with:  sudo ip netns exec $NS env VAGRANT_HOME=$VAGRANT_HOME LAB_NODES=$LAB_NODES LAB_BOX=$LAB_BOX LAB_LIBVIRT_DRIVER=$LAB_LIBVIRT_DRIVER vagrant ssh client"
    echo "remove it with the same prefix and: vagrant destroy -f; then kill $(cat "$WORK/libvirtd.pid") $(cat "$WORK/virtlogd.pid"); ip netns del $NS"
    return
  fi
  phase "cleanup"
  if [ -f "$WORK/libvirtd.pid" ]; then
    in_ns vagrant destroy -f >/dev/null 2>&1
    virsh -q pool-destroy podpath >/dev/null 2>&1
    virsh -q pool-undefine podpath >/dev/null 2>&1
    for n in podpath-nodes podpath-external vagrant-libvirt; do
      virsh -q net-destroy "$n" >/dev/null 2>&1
      virsh -q net-undefine "$n" >/dev/null 2>&1
    done
    for d in libvirtd virtlogd; do
      [ -f "$WORK/$d.pid" ] && kill "$(cat "$WORK/$d.pid")" 2>/dev/null
      rm -f "$WORK/$d.pid"
    done
  fi
  ip netns del "$NS" 2>/dev/null
  if [ -n "$HOST_BEFORE" ]; then
    if [ "$(host_state)" = "$HOST_BEFORE" ]; then echo "host network namespace unchanged"; else
      echo "the host network namespace changed:"; diff <(echo "$HOST_BEFORE") <(host_state); rc=1
    fi
  fi
  phase "done (exit $rc)"
  exit "$rc"
}

install_packages
phase "cargo build --release (the binaries the file provisioner uploads)"
cargo build --release --workspace --bins --locked -q
mkdir -p "$WORK" "$VAGRANT_HOME"
build_box
trap cleanup EXIT
trap 'exit 130' INT TERM
start_libvirt

phase "vagrant up --provider=libvirt ($LAB_NODES nodes, driver $LAB_LIBVIRT_DRIVER)"
UP_START=$(date +%s)
if ! in_ns vagrant up --provider=libvirt >"$WORK/up.log" 2>&1; then
  tail -n 40 "$WORK/up.log" >&2
  echo "vagrant up failed; the whole log is $WORK/up.log" >&2
  exit 1
fi
grep -E '^==> [a-z0-9-]+: (Creating image|Machine booted|Running provisioner: podpath)|podpath\[' "$WORK/up.log" || true
in_ns vagrant status

phase "kubectl from the host side of the node network (192.168.56.1)"
# The kubeconfig the Vagrantfile made: https with the lab CA, and the token.
kubectl() { in_ns env KUBECONFIG="$ROOT/.vagrant/podpath/kubeconfig" kubectl "$@"; }
grep -q 'server: https://192.168.56.10:6443' "$ROOT/.vagrant/podpath/kubeconfig"
for _ in $(seq 60); do
  [ "$(kubectl get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)" = "$LAB_NODES" ] && break
  sleep 2
done
kubectl get nodes -o wide
figure "vagrant up from nothing → all $LAB_NODES nodes Ready (libvirt, $LAB_LIBVIRT_DRIVER)" "$(($(date +%s) - UP_START))" s
kubectl apply -f "$ROOT/vagrant/test/echo.yaml" # one pod on node-1, its LB IP routed to node-2
LB=""
for _ in $(seq 60); do
  LB=$(kubectl get svc echo -o jsonpath='{.status.loadBalancer.ingress[0].ip}' 2>/dev/null || true)
  [ -n "$LB" ] && break
  sleep 1
done
kubectl get pods,svc -o wide
[ -n "$LB" ] || { echo "the Service got no LoadBalancer IP" >&2; exit 1; }

phase "curl http://$LB/ from the client VM (client → gateway → node-2 → NAT → node-1 → pod)"
ok=false
for _ in $(seq 60); do
  if in_ns vagrant ssh client -c "curl -sS --max-time 5 http://$LB/" 2>/dev/null | tee "$WORK/curl.out" | grep -q '^pod: default/echo'; then
    ok=true
    break
  fi
  sleep 2
done
cat "$WORK/curl.out"
$ok || { echo "the client VM got no answer from http://$LB/" >&2; exit 1; }
in_ns vagrant ssh gateway -c "ip route show $LB; curl -sS http://127.0.0.1:9900/status" 2>/dev/null | head -c 2000
echo

phase "podpath status and trace --vagrant (over vagrant ssh-config)"
podpath() { in_ns "$ROOT/target/release/podpath" "$@"; }
podpath status --vagrant="$ROOT"
ms() { echo $(($(date +%s%N) / 1000000)); }
t0=$(ms)
podpath trace --vagrant="$ROOT" "http://$LB/" | tee "$WORK/trace-vagrant.txt"
figure "podpath trace --vagrant of the LoadBalancer request, $LAB_NODES nodes ($LAB_LIBVIRT_DRIVER VMs)" "$(($(ms) - t0))" ms
grep -q 'KUBE-SVC-' "$WORK/trace-vagrant.txt" || { echo "the trace names no kube-proxy rule" >&2; exit 1; }
# The same request in a namespace lab on this machine, for the wall time beside it (made from
# the host's namespace: `ip netns exec` gives its command a mount namespace of its own, where
# the lab's namespace files would not be usable by the next command).
PODPATH=$ROOT/target/release/podpath
"$PODPATH" up --name lvtrace --nodes "$LAB_NODES" --host-programs >/dev/null
lvkubectl() { KUBECONFIG=/var/lib/podpath/lvtrace/kubeconfig command kubectl "$@"; }
lvkubectl apply -f "$ROOT/vagrant/test/echo.yaml" >/dev/null
for _ in $(seq 60); do
  lvkubectl get svc echo -o jsonpath='{.status.loadBalancer.ingress[0].ip}' | grep -q . && break
  sleep 0.5
done
lvkubectl wait --for=condition=Ready pod/echo --timeout=60s >/dev/null
t0=$(ms)
"$PODPATH" trace --name lvtrace "http://$LB/" >/dev/null
figure "podpath trace of the same request, $LAB_NODES-node namespace lab" "$(($(ms) - t0))" ms
"$PODPATH" down --name lvtrace >/dev/null

phase "cluster DNS: a pod on node-2 resolves the Service by name"
kubectl run probe --image=busybox --restart=Never --overrides='{"spec":{"nodeName":"node-2"}}' -- sleep 3600
kubectl wait --for=condition=Ready pod/probe --timeout=120s
SVC_IP=$(kubectl get svc echo -o jsonpath='{.spec.clusterIP}')
ok=false
for _ in $(seq 60); do
  if kubectl exec probe -- getent hosts echo.default.svc.cluster.local | tee "$WORK/dns.out" | grep -q "^$SVC_IP "; then
    ok=true
    break
  fi
  sleep 2
done
cat "$WORK/dns.out"
$ok || { echo "echo.default.svc.cluster.local did not resolve to $SVC_IP in a pod on node-2" >&2; exit 1; }
kubectl get pods -n kube-system -o wide
kubectl delete pod probe --wait=false

phase "vagrant provision (again: idempotent)"
main_pids() { in_ns vagrant ssh "$1" -c 'sudo systemctl show -p MainPID --value podpath-node-agent' 2>&1 | grep -v '^==>' || true; }
before=$(main_pids node-1)
[[ "$before" =~ ^[0-9]+$ ]] || { echo "cannot read node-1's agent PID: $before" >&2; exit 1; }
echo "node-1's agent: PID $before"
in_ns vagrant provision >"$WORK/provision.log" 2>&1 || { tail -n 30 "$WORK/provision.log" >&2; exit 1; }
grep -E 'podpath\[' "$WORK/provision.log" || true
in_ns vagrant ssh client -c "curl -sS --max-time 5 http://$LB/" 2>/dev/null | grep '^pod: default/echo'
in_ns vagrant ssh node-1 -c 'sudo systemctl is-active podpath-net podpath-node-agent' 2>/dev/null
[ "$(main_pids node-1)" = "$before" ] || { echo "provisioning again restarted node-1's agent" >&2; exit 1; }
echo "node-1's agent kept its PID"

phase "vagrant reload node-2 (units, sysctls and routes come back at boot)"
in_ns vagrant reload node-2 >"$WORK/reload.log" 2>&1 || { tail -n 30 "$WORK/reload.log" >&2; exit 1; }
in_ns vagrant ssh node-2 -c 'sudo systemctl is-active podpath-net podpath-node-agent; ip route show 203.0.113.0/24' 2>/dev/null
for _ in $(seq 60); do
  [ "$(kubectl get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)" = "$LAB_NODES" ] && break
  sleep 2
done
kubectl get nodes
ok=false
for _ in $(seq 30); do
  if in_ns vagrant ssh client -c "curl -sS --max-time 5 http://$LB/" 2>/dev/null | grep '^pod: default/echo'; then
    ok=true
    break
  fi
  sleep 2
done
$ok || { echo "no answer from http://$LB/ after node-2's reboot" >&2; exit 1; }

phase "vagrant halt control-plane, then up: the store is on its disk, every object is kept"
objects() { kubectl get services,deployments,configmaps,pods -A -o name | sort; }
before=$(objects)
in_ns vagrant halt control-plane >"$WORK/halt.log" 2>&1 || { tail -n 20 "$WORK/halt.log" >&2; exit 1; }
in_ns vagrant up control-plane >"$WORK/up-again.log" 2>&1 || { tail -n 20 "$WORK/up-again.log" >&2; exit 1; }
for _ in $(seq 120); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 1; done
after=$(objects)
[ "$before" = "$after" ] || { echo "objects changed across the control plane's restart:"; diff <(echo "$before") <(echo "$after"); exit 1; } >&2
echo "$(echo "$after" | wc -l) objects kept"

phase "the builder VM with real Vagrant: the checkout's archive uploaded, the trigger's fetch over SCP"
# Not its compile (hours under emulation): the archive's upload by the file provisioner, then
# a stand-in build output fetched by the trigger when `vagrant up builder` finds it running.
BUILT=$ROOT/.vagrant/podpath/bin/amd64
rm -rf "$BUILT"
in_ns vagrant up builder --no-provision >"$WORK/builder.log" 2>&1 || { tail -n 20 "$WORK/builder.log" >&2; exit 1; }
grep -q 'the builder has built nothing yet' "$WORK/builder.log" || { cat "$WORK/builder.log" >&2; exit 1; }
in_ns vagrant provision builder --provision-with podpath-source >>"$WORK/builder.log" 2>&1 ||
  { tail -n 20 "$WORK/builder.log" >&2; exit 1; }
# (`vagrant ssh -c` ends lines with CR LF.)
listing=$(in_ns vagrant ssh builder -c 'tar -tzf /tmp/podpath-source.tar.gz' 2>/dev/null | tr -d '\r')
grep -qx Cargo.lock <<<"$listing" || { echo "the builder got no checkout: $listing" >&2; exit 1; }
# shellcheck disable=SC2016 # expanded on the builder
stand_in='set -e; o=/var/lib/podpath-build/out; sudo mkdir -p $o
for b in apiserver-lite podpath node-agent podpath-workload podpath-dns podpath-bridge podpath-ipam podpath-images lb-sim; do
  sudo install -m 0755 /bin/true $o/$b; done
echo "stand-in" | sudo tee $o/BUILD-INFO >/dev/null; sha256sum /bin/true'
want=$(in_ns vagrant ssh builder -c "$stand_in" 2>/dev/null | tr -d '\r' | cut -d' ' -f1)
in_ns vagrant up builder >>"$WORK/builder.log" 2>&1 || { tail -n 20 "$WORK/builder.log" >&2; exit 1; }
grep -q "the builder's binaries are in $BUILT" "$WORK/builder.log" || { cat "$WORK/builder.log" >&2; exit 1; }
if [ "$(sha256sum "$BUILT/lb-sim" | cut -d' ' -f1)" != "$want" ] || [ "$(cat "$BUILT/BUILD-INFO")" != stand-in ]; then
  echo "the trigger fetched something else" >&2
  ls -l "$BUILT" >&2
  exit 1
fi
echo "fetched $(find "$BUILT" -type f | wc -l) files over SCP"
in_ns vagrant destroy -f builder >/dev/null
rm -rf "$BUILT"

phase "vagrant destroy -f"
if ! $KEEP; then in_ns vagrant destroy -f >/dev/null; fi
