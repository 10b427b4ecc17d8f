#!/usr/bin/env bash
# Install (idempotently) every system package the sandbox-mcp test suite needs
# on a bare Debian 12 machine, plus `uv` from PyPI.
#
# Usage:  bash .ci/lib/install-packages.sh        (or source it and call
#         install_ci_packages)
#
# Env:
#   SANDBOX_MCP_CI_EXTRA_PACKAGES  extra apt packages, space separated
#   CI_WORK_DIR                    where the apt log goes (/tmp/sandbox-mcp-ci)
#
# Fast path: when every package is already installed (dpkg-query), apt is not
# touched at all. Services are never started by the packages' maintainer
# scripts (policy-rc.d answers 101); .ci/lib/services.sh starts what is needed.

# Packages, and why:
#   docker.io        dockerd + containerd + runc + tini (docker-init for --init)
#   iptables         dockerd needs the binary even with --iptables=false
#   zfs-fuse         userspace ZFS: zpool/zfs for the zfs slot backend tests
#   postgresql       server binaries for a private throwaway cluster
#   debootstrap      deploy/build-base-image builds the sandbox images with it
#   chromium         e2e browser tests (headless)
#   iproute2         ip netns for network tests; ss for the egress byte cap (live
#                    bytes of the proxy's connections, ss -K to cut them)
#   squid            the allow-listing forward proxy of network "restricted"
#   nftables         nft: that proxy's connection bounds per sandbox and per address
#   ca-certificates  TLS to the package registries
#   git procps xz-utils  used by scripts and tests
SANDBOX_MCP_CI_PACKAGES=(
  docker.io iptables
  zfs-fuse
  postgresql
  debootstrap
  chromium
  iproute2 ca-certificates
  squid nftables
  git procps xz-utils
)

_ci_log() { printf '[install-packages] %s\n' "$*" >&2; }

_ci_missing_packages() {
  local pkg status
  for pkg in "$@"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    # "ii " = installed and configured
    if [[ "$status" != ii* ]]; then
      printf '%s\n' "$pkg"
    fi
  done
}

install_ci_packages() {
  local work_dir="${CI_WORK_DIR:-/tmp/sandbox-mcp-ci}"
  local log_dir="$work_dir/logs"
  local log="$log_dir/apt-install.log"
  mkdir -p "$log_dir"

  local -a wanted=("${SANDBOX_MCP_CI_PACKAGES[@]}")
  if [[ -n "${SANDBOX_MCP_CI_EXTRA_PACKAGES:-}" ]]; then
    local -a extra
    read -r -a extra <<<"$SANDBOX_MCP_CI_EXTRA_PACKAGES"
    wanted+=("${extra[@]}")
  fi

  local -a missing
  mapfile -t missing < <(_ci_missing_packages "${wanted[@]}")

  if ((${#missing[@]} == 0)); then
    _ci_log "all ${#wanted[@]} apt packages already installed"
  else
    _ci_log "installing: ${missing[*]} (log: $log)"
    local start=$SECONDS
    : >"$log"

    # Never let maintainer scripts start daemons (no init system here, and we
    # start private instances ourselves). Only add a policy-rc.d if none exists,
    # and remove exactly the one we added.
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [[ ! -e "$policy" ]]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy"
      chmod 755 "$policy"
      added_policy=1
    fi

    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    # Wait for a dpkg lock held by another apt run instead of failing.
    local -a apt_opts=(-y --no-install-recommends -o DPkg::Lock::Timeout=300
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    # The package lists may be absent on a fresh machine: update when no list
    # is there, or when the first install attempt cannot find a package.
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
      apt-get -o DPkg::Lock::Timeout=300 update >>"$log" 2>&1 || rc=$?
    fi
    if ((rc == 0)); then
      apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$log" 2>&1 || rc=$?
      if ((rc != 0)); then
        _ci_log "first attempt failed (rc=$rc); apt-get update and retry"
        rc=0
        apt-get -o DPkg::Lock::Timeout=300 update >>"$log" 2>&1 &&
          apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$log" 2>&1 || rc=$?
      fi
    fi

    if ((added_policy)); then
      rm -f "$policy"
    fi

    if ((rc != 0)); then
      _ci_log "ERROR: apt-get install failed (rc=$rc); last lines of $log:"
      tail -n 40 "$log" >&2
      return "$rc"
    fi
    _ci_log "apt packages installed in $((SECONDS - start))s"
  fi

  if ! command -v uv >/dev/null 2>&1; then
    _ci_log "installing uv with pip"
    if ! python3 -m pip install --quiet --disable-pip-version-check uv >>"$log" 2>&1; then
      _ci_log "ERROR: pip install uv failed; last lines of $log:"
      tail -n 20 "$log" >&2
      return 1
    fi
    # pyenv needs a new shim for a freshly installed console script.
    if ! command -v uv >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
      pyenv rehash >/dev/null 2>&1 || true
    fi
    hash -r
    if ! command -v uv >/dev/null 2>&1; then
      _ci_log "ERROR: uv installed but not on PATH ($PATH)"
      return 1
    fi
  fi
  _ci_log "uv: $(uv --version)"
}

# Run when executed, not when sourced.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  install_ci_packages
fi
