# Sourced by tests/e2e/clients/install.sh and tests/e2e/conformance/install.sh: `npm ci`
# of the committed package-lock.json in the current folder, at most once per lock.
#
# install_locked TAG HEALTHY VERSIONS MISSING [AFTER]
#   TAG       prefix of every line printed ([TAG] ...)
#   HEALTHY   a function: whether node_modules is complete and its binaries work
#   VERSIONS  a function: prints the installed versions
#   MISSING   what to say is missing when the install did not make it healthy
#   AFTER     optional function run after `npm ci` (before the stamp is written)
# Returns at once, without the network, when the lock's stamp matches and HEALTHY says so.

lock_stamp=node_modules/.sandbox-mcp-lock.sha256

# Whether node_modules was installed from this very package-lock.json.
lock_installed() {
  [[ -f "$lock_stamp" && "$(cat "$lock_stamp")" == "$(sha256sum package-lock.json | cut -d' ' -f1)" ]]
}

install_locked() {
  local tag=$1 healthy=$2 versions=$3 missing=$4 after=${5:-}
  if lock_installed && "$healthy"; then
    echo "[$tag] already installed ($("$versions"))"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "[$tag] ERROR: npm not found (apt-get install -y npm, or any Node.js with npm)" >&2
    return 1
  fi
  echo "[$tag] npm ci in $PWD"
  local start=$SECONDS
  # --ignore-scripts: no install script may download anything from outside the registry.
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  if [[ -n "$after" ]]; then "$after"; fi
  sha256sum package-lock.json | cut -d' ' -f1 >"$lock_stamp"
  if ! "$healthy"; then
    echo "[$tag] ERROR: installed, but $missing" >&2
    return 1
  fi
  echo "[$tag] installed in $((SECONDS - start))s: $("$versions")"
}
