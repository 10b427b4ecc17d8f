# shellcheck shell=bash
# Start and stop the real services the sandbox-mcp tests need: dockerd,
# zfs-fuse (+ a file-backed pool), and a private PostgreSQL cluster.
#
#   source .ci/lib/services.sh
#   trap stop_services EXIT
#   start_dockerd && start_zfs && start_postgres
#
# Every start_* waits until the service really answers (timeout, then prints
# the tail of the service log and returns 1). A daemon that is already running
# (dockerd answering on its socket, zfs-fuse answering `zpool list`) is reused
# and left running by stop_services. stop_services stops only what the start_*
# functions started, by PID (recorded in $CI_WORK_DIR/run/*.pid, so it also
# works from another shell that sources this file).
#
# Settings (env, all optional):
#   CI_WORK_DIR                    /tmp/sandbox-mcp-ci (logs/, run/, zfs/, postgres/)
#   SANDBOX_MCP_CI_DOCKERD_ARGS    extra dockerd flags (e.g. "--storage-driver=vfs")
#   SANDBOX_MCP_CI_ZPOOL           pool name (sandboxci)
#   SANDBOX_MCP_CI_ZPOOL_SIZE      sparse vdev file size (3G)
#   SANDBOX_MCP_CI_TIMEOUT         seconds to wait for each service (60)
#
# Exported:
#   start_dockerd : DOCKER_HOST only if it was already set (default socket otherwise)
#   start_zfs     : SANDBOX_MCP_TEST_ZFS_POOL, SANDBOX_MCP_TEST_ZFS_PARENT,
#                   SANDBOX_MCP_TEST_ZFS_MOUNT (mountpoint of the parent dataset)
#   start_postgres: SANDBOX_MCP_TEST_POSTGRES_URL (postgresql+asyncpg://...),
#                   SANDBOX_MCP_TEST_POSTGRES_DSN (postgresql://..., for psql/libpq)

# Paths follow CI_WORK_DIR at call time (it may be set after sourcing).
_svc_paths() {
  : "${CI_WORK_DIR:=/tmp/sandbox-mcp-ci}"
  SANDBOX_CI_LOG_DIR="$CI_WORK_DIR/logs"
  SANDBOX_CI_RUN_DIR="$CI_WORK_DIR/run"
}
_svc_paths

_svc_log() { printf '[services] %s\n' "$*" >&2; }

_svc_fail() { # message logfile
  _svc_log "ERROR: $1"
  if [[ -n "${2:-}" && -f "$2" ]]; then
    _svc_log "---- last lines of $2 ----"
    tail -n 40 "$2" >&2
    _svc_log "---- end of $2 ----"
  fi
  return 1
}

_svc_dirs() {
  _svc_paths
  mkdir -p "$SANDBOX_CI_LOG_DIR" "$SANDBOX_CI_RUN_DIR" || return 1
  chmod 755 "$CI_WORK_DIR"
}

_svc_ms() { date +%s%3N; }

# _svc_wait TIMEOUT PID CMD... : poll CMD until it succeeds; fail early when
# PID (if not empty) has exited.
_svc_wait() {
  local timeout=$1 pid=$2 deadline
  shift 2
  deadline=$(($(date +%s) + timeout))
  while :; do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if [[ -n "$pid" ]] && ! _svc_alive "$pid"; then
      return 2
    fi
    if (($(date +%s) >= deadline)); then
      return 1
    fi
    sleep 0.2
  done
}

# Alive and not a zombie.
_svc_alive() {
  local state
  [[ -r "/proc/$1/stat" ]] || return 1
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# _svc_pid_is PID COMM : the process exists and its name is COMM (guards
# against a recycled PID from a stale pid file).
_svc_pid_is() {
  [[ "$1" =~ ^[0-9]+$ ]] || return 1
  _svc_alive "$1" || return 1
  [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]]
}

# _svc_stop_pid PID NAME SIGNAL TIMEOUT : signal, wait, then SIGKILL.
_svc_stop_pid() {
  local pid=$1 name=$2 sig=$3 timeout=$4 i
  _svc_alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
  _svc_log "stopping $name (pid $pid, SIG$sig)"
  kill -s "$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 5; i++)); do
    _svc_alive "$pid" || break
    sleep 0.2
  done
  if _svc_alive "$pid"; then
    _svc_log "$name (pid $pid) still running after ${timeout}s: SIGKILL"
    kill -s KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      _svc_alive "$pid" || break
      sleep 0.1
    done
  fi
  # Reap it if it is our child (no-op otherwise).
  wait "$pid" 2>/dev/null || true
  if _svc_alive "$pid"; then
    _svc_log "WARNING: $name (pid $pid) survived SIGKILL"
    return 1
  fi
  return 0
}

# _svc_spawn LOG CMD... : start CMD in the background with stdin from
# /dev/null and output appended to LOG; print its PID. It is started from a
# subshell that exits at once, so the daemon is not a child of the caller: a
# bare `wait` in .ci/run will not block on it, and no job-control noise.
# It stays in the caller's process group.
# Inherited descriptors above 2 are closed, so that a daemon never holds a
# pipe of the CI runner open.
_svc_spawn() {
  local log=$1
  shift
  (
    local fd
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if [[ "$fd" =~ ^[0-9]+$ ]] && ((fd > 2)); then
        eval "exec $fd>&-" 2>/dev/null || true
      fi
    done
    "$@" </dev/null >>"$log" 2>&1 &
    printf '%s\n' "$!"
  )
}

# All descendants of a PID, as "PID COMM" lines (found by parent PID).
_svc_descendants() {
  local parent=$1 child comm
  while read -r child comm; do
    [[ -n "$child" ]] || continue
    printf '%s %s\n' "$child" "$comm"
    _svc_descendants "$child"
  done < <(ps -o pid=,comm= --ppid "$parent" 2>/dev/null)
}

# ======================================================================
# dockerd
# ======================================================================
_svc_docker_ok() { timeout 10 docker info >/dev/null 2>&1; }

start_dockerd() {
  _svc_dirs || return 1
  local t0 log="$SANDBOX_CI_LOG_DIR/dockerd.log" timeout=${SANDBOX_MCP_CI_TIMEOUT:-60}
  t0=$(_svc_ms)
  # Started by this library before (same CI_WORK_DIR) and still fine: keep it.
  local mine
  mine=$(cat "$SANDBOX_CI_RUN_DIR/dockerd.pid" 2>/dev/null || true)
  if _svc_pid_is "$mine" dockerd && _svc_docker_ok; then
    _svc_log "dockerd already started by this library (pid $mine): keeping it"
    return 0
  fi
  if _svc_pid_is "$mine" dockerd; then
    _svc_log "our earlier dockerd (pid $mine) does not answer: stopping it"
    _svc_descendants "$mine" >"$SANDBOX_CI_RUN_DIR/dockerd.children"
    _svc_stop_pid "$mine" dockerd TERM 15 || true
    _svc_kill_docker_leftovers
  fi
  rm -f "$SANDBOX_CI_RUN_DIR/dockerd.pid" "$SANDBOX_CI_RUN_DIR/docker-containers-before"

  if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
    _svc_fail "docker/dockerd not installed (run .ci/lib/install-packages.sh)"
    return 1
  fi
  if _svc_docker_ok; then
    _svc_log "dockerd already running (${DOCKER_HOST:-unix:///var/run/docker.sock}): reusing it, will not stop it"
    return 0
  fi
  if [[ -n "${DOCKER_HOST:-}" && "$DOCKER_HOST" != unix:///var/run/docker.sock ]]; then
    _svc_fail "DOCKER_HOST=$DOCKER_HOST is set but does not answer; unset it to let start_dockerd start a local dockerd"
    return 1
  fi
  # A dockerd that is starting (pid file, live process): wait for it.
  local other
  other=$(cat /var/run/docker.pid 2>/dev/null || true)
  if _svc_pid_is "$other" dockerd; then
    _svc_log "dockerd pid $other exists but does not answer yet: waiting for it"
    if _svc_wait "$timeout" "$other" _svc_docker_ok; then
      _svc_log "dockerd pid $other is up: reusing it, will not stop it"
      return 0
    fi
    _svc_fail "dockerd pid $other (not ours) never answered; not touching it"
    return 1
  fi

  local -a user_args=() args
  if [[ -n "${SANDBOX_MCP_CI_DOCKERD_ARGS:-}" ]]; then
    read -r -a user_args <<<"$SANDBOX_MCP_CI_DOCKERD_ARGS"
  fi
  # Defaults work on this VM (kernel 6.18, ext4 root, cgroup v1 hybrid):
  # overlay2 storage, iptables (nf_tables) bridge networking. Fallbacks below
  # are only used when dockerd fails to come up with them.
  local attempt pid rc
  local -a extra=()
  for attempt in 1 2; do
    args=(--host=unix:///var/run/docker.sock --log-level=warn "${extra[@]}" "${user_args[@]}")
    _svc_log "starting dockerd ${args[*]} (log: $log)"
    : >"$log"
    pid=$(_svc_spawn "$log" dockerd "${args[@]}")
    printf '%s\n' "$pid" >"$SANDBOX_CI_RUN_DIR/dockerd.pid"
    rc=0
    _svc_wait "$timeout" "$pid" _svc_docker_ok || rc=$?
    if ((rc == 0)); then
      break
    fi
    # Did not come up: stop what we started, then decide on a fallback.
    _svc_descendants "$pid" >"$SANDBOX_CI_RUN_DIR/dockerd.children"
    _svc_stop_pid "$pid" dockerd TERM 15 || true
    _svc_kill_docker_leftovers
    rm -f "$SANDBOX_CI_RUN_DIR/dockerd.pid"
    if ((attempt == 1)); then
      extra=()
      if grep -qiE 'iptables|nf_tables|xtables' "$log"; then
        extra+=(--iptables=false --ip-masq=false)
      fi
      if grep -qiE 'overlay|graphdriver|storage-driver|driver not supported' "$log"; then
        extra+=(--storage-driver=vfs)
      fi
      if ((${#extra[@]})); then
        cp "$log" "$log.attempt1"
        _svc_log "dockerd failed (rc=$rc); retrying with ${extra[*]} (first log: $log.attempt1)"
        continue
      fi
    fi
    _svc_fail "dockerd did not answer within ${timeout}s (rc=$rc)" "$log"
    return 1
  done

  # Remember which containers existed, so stop_services removes only ours.
  docker ps -aq --no-trunc >"$SANDBOX_CI_RUN_DIR/docker-containers-before" 2>/dev/null || true
  _svc_log "dockerd up (pid $pid, storage $(docker info --format '{{.Driver}}' 2>/dev/null), cgroup v$(docker info --format '{{.CgroupVersion}}' 2>/dev/null)) in $(($(_svc_ms) - t0)) ms"
}

# Kill the managed containerd and shims a dead dockerd may leave behind.
_svc_kill_docker_leftovers() {
  local p f="$SANDBOX_CI_RUN_DIR/dockerd.children"
  if [[ -f "$f" ]]; then
    # Lines are "PID COMM"; kill only if the PID still names the same program.
    local comm
    while read -r p comm; do
      if [[ -n "$comm" ]] && _svc_pid_is "$p" "$comm"; then
        kill -s KILL "$p" 2>/dev/null || true
      fi
    done <"$f"
  fi
  rm -f "$SANDBOX_CI_RUN_DIR/dockerd.children"
}

_svc_stop_dockerd() {
  local pidf="$SANDBOX_CI_RUN_DIR/dockerd.pid" pid
  [[ -f "$pidf" ]] || return 0
  pid=$(cat "$pidf")
  if ! _svc_pid_is "$pid" dockerd; then
    rm -f "$pidf" "$SANDBOX_CI_RUN_DIR/docker-containers-before"
    return 0
  fi
  # Remove the containers created since start_dockerd (tests should have
  # removed theirs; this catches leaks so the daemon stops fast).
  local before="$SANDBOX_CI_RUN_DIR/docker-containers-before" c
  local -a ours=()
  if _svc_docker_ok; then
    while read -r c; do
      [[ -n "$c" ]] || continue
      if [[ ! -f "$before" ]] || ! grep -qx "$c" "$before"; then
        ours+=("$c")
      fi
    done < <(docker ps -aq --no-trunc 2>/dev/null)
    if ((${#ours[@]})); then
      _svc_log "removing ${#ours[@]} container(s) left by this run"
      timeout 60 docker rm -f "${ours[@]}" >/dev/null 2>&1 || true
    fi
  fi
  _svc_descendants "$pid" >"$SANDBOX_CI_RUN_DIR/dockerd.children"
  _svc_stop_pid "$pid" dockerd TERM 30 || true
  # containerd normally exits with dockerd; after a SIGKILL it may not.
  _svc_kill_docker_leftovers
  rm -f "$pidf" "$before"
}

# ======================================================================
# zfs-fuse + a file-backed pool
# ======================================================================
_svc_zfs_ok() { timeout -k 2 10 zpool list -H >/dev/null 2>&1; }

# zfs-fuse can wedge (seen here: `zfs destroy -r` of nested mounted datasets
# left umount waiting on the daemon forever), so every zfs/zpool call is
# bounded; FUSE waits only yield to SIGKILL, hence -k.
_svc_z() { timeout -k 5 "${SANDBOX_MCP_CI_ZFS_CMD_TIMEOUT:-60}" "$@"; }

start_zfs() {
  _svc_dirs || return 1
  local t0 log="$SANDBOX_CI_LOG_DIR/zfs-fuse.log" timeout=${SANDBOX_MCP_CI_TIMEOUT:-60}
  local pool=${SANDBOX_MCP_CI_ZPOOL:-sandboxci} size=${SANDBOX_MCP_CI_ZPOOL_SIZE:-3G}
  local zdir="$CI_WORK_DIR/zfs"
  local vdev="$zdir/$pool.vdev" mnt="$zdir/mnt/$pool"
  t0=$(_svc_ms)
  # Already set up in this shell: keep it (do not wipe the pool mid-run).
  if [[ "${SANDBOX_MCP_TEST_ZFS_PARENT:-}" == "$pool/slots" ]] && _svc_zfs_ok &&
    _svc_z zfs list -H -o name "$pool/slots" >/dev/null 2>&1; then
    _svc_log "zfs already set up ($pool/slots): keeping it"
    return 0
  fi
  # Our own zfs-fuse from an earlier call may still run: stays ours.
  local mine
  mine=$(cat "$SANDBOX_CI_RUN_DIR/zfs-fuse.pid" 2>/dev/null || true)
  if ! _svc_pid_is "$mine" zfs-fuse; then
    mine=""
    rm -f "$SANDBOX_CI_RUN_DIR/zfs-fuse.pid"
  fi

  if ! command -v zfs-fuse >/dev/null 2>&1 || ! command -v zpool >/dev/null 2>&1; then
    _svc_fail "zfs-fuse not installed (run .ci/lib/install-packages.sh)"
    return 1
  fi

  if [[ -n "$mine" ]] && _svc_zfs_ok; then
    _svc_log "zfs-fuse already started by this library (pid $mine): keeping it"
  elif _svc_zfs_ok; then
    _svc_log "zfs-fuse already running (not ours): reusing it, will not stop it"
  else
    if [[ -n "$mine" ]]; then
      _svc_log "our earlier zfs-fuse (pid $mine) does not answer: stopping it"
      _svc_stop_pid "$mine" zfs-fuse TERM 10 || true
      rm -f "$SANDBOX_CI_RUN_DIR/zfs-fuse.pid"
    fi
    if [[ ! -c /dev/fuse ]]; then
      _svc_fail "/dev/fuse is missing: zfs-fuse cannot run here"
      return 1
    fi
    # A daemon killed earlier can leave its socket and stale FUSE mounts.
    _svc_zfs_unmount_stale "$zdir/mnt"
    _svc_log "starting zfs-fuse (log: $log)"
    : >"$log"
    local pid rc=0
    pid=$(_svc_spawn "$log" zfs-fuse --no-daemon --no-kstat-mount \
      --pidfile "$SANDBOX_CI_RUN_DIR/zfs-fuse.daemon.pid")
    printf '%s\n' "$pid" >"$SANDBOX_CI_RUN_DIR/zfs-fuse.pid"
    _svc_wait "$timeout" "$pid" _svc_zfs_ok || rc=$?
    if ((rc != 0)); then
      # zfs-fuse logs to syslog (absent here), so its own log is often empty.
      # It exits at once when another instance holds /var/lock/zfs/zfs_lock.
      _svc_log "zfs-fuse processes now: $(ps -o pid=,args= -C zfs-fuse 2>/dev/null | tr '\n' ';')"
      _svc_fail "zfs-fuse did not answer within ${timeout}s (rc=$rc; 2 = it exited: another zfs-fuse holding /var/lock/zfs/zfs_lock?)" "$log"
      _svc_stop_pid "$pid" zfs-fuse TERM 10 || true
      rm -f "$SANDBOX_CI_RUN_DIR/zfs-fuse.pid"
      return 1
    fi
    _svc_log "zfs-fuse up (pid $pid) in $(($(_svc_ms) - t0)) ms"
  fi

  # A pool of this name from an earlier run: destroy it (it is ours by name).
  if _svc_z zpool list -H -o name "$pool" >/dev/null 2>&1; then
    # Containers of an earlier run that bind-mount its datasets keep it busy.
    _svc_docker_rm_using "$zdir/mnt/"
    _svc_log "destroying leftover pool $pool"
    _svc_zpool_destroy "$pool" || {
      _svc_fail "cannot destroy leftover pool $pool"
      return 1
    }
  fi
  _svc_zfs_unmount_stale "$zdir/mnt"
  # zpool create refuses a non-empty mountpoint: clear leftovers of earlier
  # runs (files written while the dataset was not mounted), never through a
  # live mount.
  if awk -v d="$zdir/mnt/" 'index($2 "/", d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    _svc_fail "something is still mounted under $zdir/mnt; not touching it"
    return 1
  fi
  rm -rf --one-file-system "${zdir:?}/mnt"
  mkdir -p "$zdir/mnt"
  rm -f "$vdev"
  truncate -s "$size" "$vdev"
  local zlog="$SANDBOX_CI_LOG_DIR/zpool.log"
  if ! _svc_z zpool create -f -m "$mnt" "$pool" "$vdev" >"$zlog" 2>&1; then
    _svc_fail "zpool create $pool $vdev failed" "$zlog"
    return 1
  fi
  printf '%s\n' "$pool" >"$SANDBOX_CI_RUN_DIR/zpool"
  if ! _svc_z zfs create "$pool/slots" >>"$zlog" 2>&1; then
    _svc_fail "zfs create $pool/slots failed" "$zlog"
    return 1
  fi
  # Usable: listed, mounted, writable (bounded: a wedged FUSE mount hangs).
  local probe="$mnt/slots/.ci-probe"
  # shellcheck disable=SC2016
  if ! _svc_z zfs list -H -o name "$pool/slots" >/dev/null 2>&1 ||
    ! _svc_wait 10 "" test -d "$mnt/slots" ||
    [[ "$(timeout -k 2 10 sh -c 'echo ok >"$1" && cat "$1" && rm -f "$1"' sh "$probe" 2>/dev/null)" != ok ]]; then
    _svc_fail "pool $pool created but $mnt/slots is not usable" "$zlog"
    return 1
  fi
  export SANDBOX_MCP_TEST_ZFS_POOL="$pool"
  export SANDBOX_MCP_TEST_ZFS_PARENT="$pool/slots"
  export SANDBOX_MCP_TEST_ZFS_MOUNT="$mnt/slots"
  _svc_log "zfs ready: SANDBOX_MCP_TEST_ZFS_PARENT=$SANDBOX_MCP_TEST_ZFS_PARENT (mounted at $mnt/slots, $size sparse file $vdev) in $(($(_svc_ms) - t0)) ms"
}

# Remove containers (any state) with a mount whose source is under PREFIX.
_svc_docker_rm_using() {
  local prefix=$1 c src
  _svc_docker_ok || return 0
  local -a hits=()
  while read -r c; do
    [[ -n "$c" ]] || continue
    while read -r src; do
      if [[ "$src" == "$prefix"* ]]; then
        hits+=("$c")
        break
      fi
    done < <(docker inspect --format '{{range .Mounts}}{{println .Source}}{{end}}' "$c" 2>/dev/null)
  done < <(docker ps -aq --no-trunc 2>/dev/null)
  if ((${#hits[@]})); then
    _svc_log "removing ${#hits[@]} leftover container(s) using $prefix"
    timeout 60 docker rm -f "${hits[@]}" >/dev/null 2>&1 || true
  fi
}

# Lazily unmount FUSE mounts left under DIR by a dead zfs-fuse.
_svc_zfs_unmount_stale() {
  local dir=$1 m
  [[ -d "$dir" ]] || return 0
  while read -r m; do
    if ! timeout -k 1 5 stat "$m" >/dev/null 2>&1; then
      _svc_log "unmounting stale mount $m"
      umount -l "$m" 2>/dev/null || true
    fi
  done < <(awk -v d="$dir/" 'index($2, d) == 1 && $3 ~ /^fuse/ { print $2 }' /proc/self/mounts | sort -r)
}

_svc_zpool_destroy() { # pool: destroy, retrying while busy, not when wedged
  local pool=$1 i rc
  for ((i = 0; i < 5; i++)); do
    rc=0
    _svc_z zpool destroy -f "$pool" >>"$SANDBOX_CI_LOG_DIR/zpool.log" 2>&1 || rc=$?
    ((rc == 0)) && return 0
    if ((rc == 124 || rc == 137)); then
      _svc_log "zpool destroy $pool timed out: zfs-fuse looks wedged"
      return 1
    fi
    _svc_z zpool list -H -o name "$pool" >/dev/null 2>&1 || return 0
    sleep 1
  done
  return 1
}

_svc_stop_zfs() {
  local poolf="$SANDBOX_CI_RUN_DIR/zpool" pidf="$SANDBOX_CI_RUN_DIR/zfs-fuse.pid" pool pid
  local zdir="$CI_WORK_DIR/zfs"
  if [[ -f "$poolf" ]]; then
    pool=$(cat "$poolf")
    if _svc_zfs_ok && _svc_z zpool list -H -o name "$pool" >/dev/null 2>&1; then
      _svc_log "destroying pool $pool"
      _svc_zpool_destroy "$pool" || _svc_log "WARNING: could not destroy pool $pool"
    fi
    rm -f "$poolf" "$zdir/$pool.vdev"
  fi
  if [[ -f "$pidf" ]]; then
    pid=$(cat "$pidf")
    if _svc_pid_is "$pid" zfs-fuse; then
      _svc_stop_pid "$pid" zfs-fuse TERM 30 || true
    fi
    rm -f "$pidf" "$SANDBOX_CI_RUN_DIR/zfs-fuse.daemon.pid"
    _svc_zfs_unmount_stale "$zdir/mnt"
  fi
}

# ======================================================================
# PostgreSQL: a private throwaway cluster on 127.0.0.1:<free port>
# ======================================================================
_svc_pg_bindir() {
  local d
  d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
  [[ -n "$d" && -x "$d/initdb" && -x "$d/postgres" ]] || return 1
  printf '%s\n' "$d"
}

_svc_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

_svc_as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

start_postgres() {
  _svc_dirs || return 1
  local t0 timeout=${SANDBOX_MCP_CI_TIMEOUT:-60} bindir
  local pgdir="$CI_WORK_DIR/postgres" log="$SANDBOX_CI_LOG_DIR/postgres.log"
  local ilog="$SANDBOX_CI_LOG_DIR/postgres-init.log"
  t0=$(_svc_ms)
  # Already started in this shell and answering: keep it.
  if [[ -n "${SANDBOX_MCP_TEST_POSTGRES_DSN:-}" ]] &&
    _svc_pid_is "$(cat "$SANDBOX_CI_RUN_DIR/postgres.pid" 2>/dev/null)" postgres &&
    timeout 10 psql "$SANDBOX_MCP_TEST_POSTGRES_DSN" -tAc 'select 1' >/dev/null 2>&1; then
    _svc_log "private postgres already running: keeping it"
    return 0
  fi
  if ! bindir=$(_svc_pg_bindir); then
    _svc_fail "PostgreSQL server binaries not found under /usr/lib/postgresql (install postgresql)"
    return 1
  fi
  if ! id postgres >/dev/null 2>&1; then
    _svc_fail "no 'postgres' system user (install postgresql)"
    return 1
  fi

  # A cluster of ours left running by an earlier run (same data dir): stop it.
  local old
  old=$(head -n 1 "$pgdir/data/postmaster.pid" 2>/dev/null || true)
  if _svc_pid_is "$old" postgres; then
    _svc_log "stopping leftover private postgres (pid $old) from an earlier run"
    _svc_stop_pid "$old" postgres INT 20 || true
  fi
  rm -f "$SANDBOX_CI_RUN_DIR/postgres.pid"
  rm -rf "$pgdir"
  mkdir -p "$pgdir/sock"
  chown -R postgres:postgres "$pgdir"
  chmod 700 "$pgdir"
  if ! _svc_as_postgres test -w "$pgdir"; then
    _svc_fail "user postgres cannot write $pgdir (is a parent dir of CI_WORK_DIR=$CI_WORK_DIR not traversable?)"
    return 1
  fi

  local user=sandbox db=sandbox_mcp_test pass port
  pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
  port=$(_svc_free_port) || {
    _svc_fail "cannot find a free port"
    return 1
  }
  printf '%s\n' "$pass" >"$pgdir/pwfile"
  chown postgres:postgres "$pgdir/pwfile"
  chmod 600 "$pgdir/pwfile"

  : >"$ilog"
  if ! _svc_as_postgres env LC_ALL=C.UTF-8 "$bindir/initdb" -D "$pgdir/data" -U postgres \
    --pwfile="$pgdir/pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --no-instructions >>"$ilog" 2>&1; then
    _svc_fail "initdb failed" "$ilog"
    return 1
  fi

  _svc_log "starting private postgres on 127.0.0.1:$port (data $pgdir/data, log $log)"
  : >"$log"
  chown postgres:postgres "$log"
  # fsync off etc.: a throwaway test cluster, speed over durability.
  # setpriv execs postgres, so the PID is the postmaster's.
  local pid rc=0
  pid=$(_svc_spawn "$log" setpriv --reuid=postgres --regid=postgres --init-groups -- \
    "$bindir/postgres" -D "$pgdir/data" \
    -c listen_addresses=127.0.0.1 -c port="$port" \
    -c unix_socket_directories="$pgdir/sock" \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
    -c max_connections=200 -c shared_buffers=128MB)
  printf '%s\n' "$pid" >"$SANDBOX_CI_RUN_DIR/postgres.pid"
  _svc_wait "$timeout" "$pid" "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" || rc=$?
  if ((rc != 0)); then
    _svc_fail "postgres did not become ready within ${timeout}s (rc=$rc)" "$log"
    _svc_stop_pid "$pid" postgres INT 10 || true
    rm -f "$SANDBOX_CI_RUN_DIR/postgres.pid"
    return 1
  fi

  # Role + database, then prove the URL's credentials work over TCP.
  local psql="$bindir/psql"
  if ! _svc_as_postgres "$psql" -h "$pgdir/sock" -p "$port" -U postgres -d postgres \
    -v ON_ERROR_STOP=1 -q >>"$ilog" 2>&1 <<SQL; then
CREATE ROLE $user LOGIN PASSWORD '$pass' CREATEDB;
CREATE DATABASE $db OWNER $user;
SQL
    _svc_fail "creating role/database failed" "$ilog"
    return 1
  fi
  local got
  got=$(PGPASSWORD="$pass" "$psql" -h 127.0.0.1 -p "$port" -U "$user" -d "$db" \
    -tAc 'select current_user || current_database()' 2>>"$ilog" || true)
  if [[ "$got" != "$user$db" ]]; then
    _svc_fail "test query over TCP failed (got '$got')" "$ilog"
    return 1
  fi
  export SANDBOX_MCP_TEST_POSTGRES_URL="postgresql+asyncpg://$user:$pass@127.0.0.1:$port/$db"
  export SANDBOX_MCP_TEST_POSTGRES_DSN="postgresql://$user:$pass@127.0.0.1:$port/$db"
  _svc_log "postgres ready (pid $pid, 127.0.0.1:$port, db $db, user $user) in $(($(_svc_ms) - t0)) ms"
}

_svc_stop_postgres() {
  local pidf="$SANDBOX_CI_RUN_DIR/postgres.pid" pgdir="$CI_WORK_DIR/postgres" pid pm
  [[ -f "$pidf" ]] || return 0
  pid=$(cat "$pidf")
  # The postmaster of our private data dir, if the recorded PID is not it.
  if ! _svc_pid_is "$pid" postgres; then
    pm=$(head -n 1 "$pgdir/data/postmaster.pid" 2>/dev/null || true)
    if _svc_pid_is "$pm" postgres; then
      pid=$pm
    fi
  fi
  if _svc_pid_is "$pid" postgres; then
    # SIGINT = fast shutdown (disconnects clients); SIGKILL after 30 s.
    _svc_stop_pid "$pid" postgres INT 30 || true
  fi
  if _svc_pid_is "$pid" postgres; then
    _svc_log "WARNING: postgres (pid $pid) still running; keeping $pgdir"
    return 1
  fi
  rm -f "$pidf"
  rm -rf "$pgdir"
}

# ======================================================================
# stop everything this library started (safe to call more than once, and
# from an EXIT trap: never fails)
# ======================================================================
stop_services() {
  local t0
  _svc_paths
  t0=$(_svc_ms)
  _svc_stop_postgres || true
  # dockerd before the pool: containers may hold bind mounts of datasets.
  _svc_stop_dockerd || true
  _svc_stop_zfs || true
  # provision (as root) seals dir slots with a bind mount; tests undo theirs, but a run
  # killed midway would leave some under the work dir, where nothing could delete them.
  local point
  for point in $(awk -v dir="$CI_WORK_DIR/" 'index($5, dir) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$point" && _svc_log "unmounted $point, left by a test"
  done
  _svc_log "services stopped in $(($(_svc_ms) - t0)) ms"
  return 0
}
