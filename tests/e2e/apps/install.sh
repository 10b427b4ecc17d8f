#!/usr/bin/env bash
# Install the pinned MCP Apps host bridge into tests/e2e/apps/node_modules (used by
# tests/e2e/test_apps_view_browser.py):
#   @modelcontextprotocol/ext-apps   the MCP Apps SDK: its AppBridge is the host side
#   @modelcontextprotocol/client     its peer dependencies (the Protocol class, the
#   @modelcontextprotocol/core         schemas), pinned with it
#   esbuild                          bundles host_bridge.mjs for the browser
#
# Usage: bash tests/e2e/apps/install.sh
#
# Runs `npm ci` from the committed package-lock.json (exact versions), then bundles
# host_bridge.mjs into node_modules/.bundle/host-bridge.js: one file the test's host
# page loads, so the browser fetches nothing from a registry or a CDN. Idempotent: when
# node_modules was installed from the same lock file and the bundle is there, it
# returns at once without touching the network. esbuild's binary comes from the
# registry as its platform package (@esbuild/linux-x64...); with --ignore-scripts its
# postinstall (which only checks that binary) is skipped, and the bundle step is the
# check.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

# shellcheck source=../npm_locked.sh
source ../npm_locked.sh

bundle=node_modules/.bundle/host-bridge.js

versions() {
  echo "ext-apps $(node -p 'require("./node_modules/@modelcontextprotocol/ext-apps/package.json").version')," \
    "esbuild $(node_modules/.bin/esbuild --version)," \
    "bundle $(wc -c <"$bundle") bytes"
}

healthy() {
  [[ -f node_modules/@modelcontextprotocol/ext-apps/package.json ]] || return 1
  [[ -s "$bundle" && "$bundle" -nt host_bridge.mjs ]] || return 1
}

build_bundle() {
  mkdir -p "$(dirname "$bundle")"
  node_modules/.bin/esbuild host_bridge.mjs --bundle --format=esm --platform=browser \
    --log-level=warning --outfile="$bundle"
}

if lock_installed && ! healthy && [[ -x node_modules/.bin/esbuild ]]; then
  build_bundle  # host_bridge.mjs changed: the same packages, a new bundle
fi
install_locked apps healthy versions "the host bridge bundle is missing" build_bundle
