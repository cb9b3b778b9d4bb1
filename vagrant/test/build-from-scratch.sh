#!/usr/bin/env bash
# The builder's provisioner (vagrant/build.sh) from nothing, as on a new builder VM: a chroot of
# the harness's Debian root filesystem with no Rust, no cargo caches and no target directory,
# the checkout archived as the Vagrantfile archives it. It installs rustup and the pinned
# toolchain, fetches the crates and compiles the release binaries; prints the wall time.
# Needs root, the internet (static.rust-lang.org, crates.io) and the root filesystem
# (vagrant/test/rootfs.sh). Uses the host's network namespace and changes nothing in it; its
# files are removed at the end. Usage: vagrant/test/build-from-scratch.sh [PROFILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
PROFILE=${1:-release}
ROOTFS=$PWD/target/vagrant-rootfs
[ -f "$ROOTFS/.podpath-rootfs-5" ] || bash vagrant/test/rootfs.sh "$ROOTFS"
work=$(mktemp -d /tmp/podpath-build-from-scratch.XXXXXX)
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" || umount -l "${mounted[i]}"; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/upper" "$work/work" "$work/root"
mount -t overlay overlay -o "lowerdir=$ROOTFS,upperdir=$work/upper,workdir=$work/work" "$work/root"
mounted+=("$work/root")
mount -t proc proc "$work/root/proc"
mounted+=("$work/root/proc")
mount --bind /dev "$work/root/dev"
mounted+=("$work/root/dev")
cp /etc/resolv.conf "$work/root/etc/resolv.conf"
# The host's trusted CAs (a network that inspects TLS has its own), as a VM's box would be given.
cp /etc/ssl/certs/ca-certificates.crt "$work/root/etc/ssl/certs/ca-certificates.crt"
# The archive, made by the Vagrantfile's own function.
ruby -rfileutils -e 'src = File.read("Vagrantfile"); eval(src[/^module PodpathLab\b.*?^end$/m]); PodpathLab.source_archive(Dir.pwd, ARGV[0])' \
  "$work/root/tmp/podpath-source.tar.gz"
bins=$(ruby -rfileutils -e 'src = File.read("Vagrantfile"); eval(src[/^module PodpathLab\b.*?^end$/m]); puts PodpathLab::BINARIES.values.flatten.uniq.join(" ")')
# The script is uploaded, as Vagrant's shell provisioner does (and an edit of the checkout
# meanwhile cannot change what bash is reading).
cp vagrant/build.sh "$work/root/tmp/vagrant-shell"
start=$(date +%s)
chroot "$work/root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LAB_SOURCE_ARCHIVE=/tmp/podpath-source.tar.gz LAB_BUILD_OUT=/var/lib/podpath-build/out \
  LAB_BUILD_PROFILE="$PROFILE" LAB_BINARIES="$bins" bash /tmp/vagrant-shell
seconds=$(($(date +%s) - start))
cat "$work/root/var/lib/podpath-build/out/BUILD-INFO"
for b in $bins; do
  "$work/root/var/lib/podpath-build/out/$b" --help >/dev/null 2>&1 || [ "$b" = podpath-workload ] ||
    [ "$b" = podpath-bridge ] || [ "$b" = podpath-ipam ] || { echo "$b does not run" >&2; exit 1; }
done
echo "build-from-scratch: rustup, Rust, the crates and a $PROFILE build of $(echo "$bins" | wc -w) binaries in $seconds s ($(nproc) CPUs)"
