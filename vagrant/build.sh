#!/usr/bin/env bash
# The builder VM's provisioner (`vagrant up builder`): compiles podpath from the checkout the
# Vagrantfile uploaded as an archive, with the toolchain pinned in vagrant/rust-toolchain.toml
# (installed by rustup), and leaves the lab's binaries with a BUILD-INFO in LAB_BUILD_OUT, from
# where the Vagrantfile's trigger fetches them to the host.
#
# Incremental: the source tree and cargo's target directory stay on the VM's disk, and files
# whose contents did not change keep their times (rsync compares checksums), so building again
# after an edit recompiles what the edit touched. Needs the internet (a Debian mirror, rustup's
# server, crates.io) through Vagrant's management network; the lab's machines never do.
set -euo pipefail

: "${LAB_SOURCE_ARCHIVE:?}" "${LAB_BUILD_OUT:?}" "${LAB_BINARIES:?}"
LAB_BUILD_PROFILE=${LAB_BUILD_PROFILE:-release}
LAB_BUILD_DIR=${LAB_BUILD_DIR:-/var/lib/podpath-build}
export RUSTUP_HOME=${RUSTUP_HOME:-/opt/rust/rustup} CARGO_HOME=${CARGO_HOME:-/opt/rust/cargo}
export PATH=$CARGO_HOME/bin:$PATH
export CARGO_TARGET_DIR=$LAB_BUILD_DIR/target
SRC=$LAB_BUILD_DIR/src
LOG=$LAB_BUILD_DIR/build.log

say() { echo "podpath[builder]: $*"; }
# Vagrant provisions a machine on its first `up` only: the way on after a fix is said.
die() { echo "podpath[builder]: error: $* (then \`vagrant provision builder\` goes on from here)" >&2; exit 1; }

case "$LAB_BUILD_PROFILE" in
  release) PROFILE_DIR=release ;;
  dev) PROFILE_DIR=debug ;;
  *) die "build profile $LAB_BUILD_PROFILE: expected release or dev" ;;
esac

# Debian packages the build needs (a C compiler and libc's headers for the linker and the few
# crates that compile C), installed only when missing.
missing=()
for pkg in gcc libc6-dev rsync curl ca-certificates; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >/dev/null || die "could not install ${missing[*]} (the builder needs a Debian mirror)"
fi

# The checkout: unpacked beside the build tree, then synced into it by contents.
[ -f "$LAB_SOURCE_ARCHIVE" ] || die "$LAB_SOURCE_ARCHIVE was not uploaded (vagrant up builder uploads the checkout)"
stage=$LAB_BUILD_DIR/src.new
rm -rf "$stage"
mkdir -p "$stage" "$SRC"
tar -xzf "$LAB_SOURCE_ARCHIVE" -C "$stage" || die "cannot unpack $LAB_SOURCE_ARCHIVE"
{ [ -f "$stage/Cargo.lock" ] && [ -f "$stage/vagrant/rust-toolchain.toml" ]; } ||
  die "$LAB_SOURCE_ARCHIVE is not a podpath checkout (no Cargo.lock or vagrant/rust-toolchain.toml)"
rsync -rc --delete "$stage/" "$SRC/"
rm -rf "$stage"

toolchain=$(sed -n 's/^channel *= *"\([^"]*\)".*/\1/p' "$SRC/vagrant/rust-toolchain.toml")
[ -n "$toolchain" ] || die "no channel in vagrant/rust-toolchain.toml"
if ! command -v rustup >/dev/null; then
  arch=$(uname -m)
  say "installing rustup ($arch)"
  curl --proto '=https' --tlsv1.2 -sSf -o /tmp/rustup-init \
    "https://static.rust-lang.org/rustup/dist/$arch-unknown-linux-gnu/rustup-init" ||
    die "cannot download rustup from static.rust-lang.org (the builder needs the internet)"
  chmod +x /tmp/rustup-init
  /tmp/rustup-init -y -q --no-modify-path --profile minimal --default-toolchain none >/dev/null ||
    die "rustup-init failed"
  rm -f /tmp/rustup-init
fi
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
  say "installing Rust $toolchain"
  rustup toolchain install "$toolchain" --profile minimal >/dev/null || die "cannot install Rust $toolchain"
fi

bins=()
for b in $LAB_BINARIES; do bins+=(--bin "$b"); done
say "compiling with $(rustup run "$toolchain" rustc --version) ($LAB_BUILD_PROFILE profile; the first build takes many minutes)"
start=$(date +%s)
if ! (cd "$SRC" && cargo "+$toolchain" build --locked --workspace --profile "$LAB_BUILD_PROFILE" "${bins[@]}") >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  die "cargo build failed (the whole log is $LOG on the builder)"
fi
seconds=$(($(date +%s) - start))

# The binaries and what they were built from, in place whole (the host fetches this directory).
out_new=$LAB_BUILD_OUT.new
rm -rf "$out_new"
mkdir -p "$out_new"
for b in $LAB_BINARIES; do
  install -m 0755 "$CARGO_TARGET_DIR/$PROFILE_DIR/$b" "$out_new/$b"
done
{
  echo "source: sha256 $(sha256sum "$LAB_SOURCE_ARCHIVE" | cut -d' ' -f1)"
  echo "toolchain: $(rustup run "$toolchain" rustc --version)"
  echo "profile: $LAB_BUILD_PROFILE"
  echo "architecture: $(uname -m)"
  echo "compiled in: $seconds s"
} >"$out_new/BUILD-INFO"
chmod 0755 "$out_new"
rm -rf "$LAB_BUILD_OUT"
mv "$out_new" "$LAB_BUILD_OUT"
say "built $(echo "$LAB_BINARIES" | wc -w) binaries in $seconds s: $LAB_BUILD_OUT"
