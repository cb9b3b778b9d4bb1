#!/usr/bin/env bash
# Builds the Debian root filesystem the namespace harness gives every machine of the Vagrantfile
# (`vagrant/test/rootfs.sh DIR`): Debian 12 minbase with what the provisioning script uses, and
# sshd and sudo, through which `podpath … --vagrant` reaches the machines as on VMs, crun (pods of
# images), and what the
# builder's script compiles with (gcc, libc's headers, rsync; the machines have no internet). The
# binaries it runs are the host's, so the suite must match the host's glibc (Debian 12 here).
# Idempotent: a complete DIR (marked by DIR/.podpath-rootfs-5; the number grows with the package
# list, so an older root is built again) is left alone.
set -euo pipefail
DIR=${1:?usage: rootfs.sh DIR}
SUITE=${ROOTFS_SUITE:-bookworm}
[ -f "$DIR/.podpath-rootfs-5" ] && exit 0
command -v debootstrap >/dev/null || { echo "rootfs.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
# The archive the host's apt already uses (deb822 or one-line sources), else Debian's CDN.
MIRROR=${ROOTFS_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
rm -rf "$DIR.partial"
mkdir -p "$(dirname "$DIR")"
debootstrap --variant=minbase \
  --include=iproute2,iptables,nftables,curl,ca-certificates,procps,conntrack,kmod,openssh-server,sudo,gcc,libc6-dev,rsync,crun \
  "$SUITE" "$DIR.partial" "$MIRROR" >"$DIR.partial.log" 2>&1 ||
  { tail -n 20 "$DIR.partial.log" >&2; echo "rootfs.sh: debootstrap $SUITE from $MIRROR failed" >&2; exit 1; }
rm -rf "$DIR.partial/var/cache/apt/archives/"*.deb "$DIR.partial.log"
touch "$DIR.partial/.podpath-rootfs-5"
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
