"""One command inside a container, and how its whole process tree is killed.

Every command runs under three processes of ours (argv from :func:`job_argv`)::

    /sbin/docker-init -s            T: tini, a *child subreaper* (PR_SET_CHILD_SUBREAPER)
      └─ /bin/sh -c SUPERVISOR      W: announces "T W", runs the command, cleans up
           └─ setsid /bin/sh -c CMD C: the command, in its own session and group

Because T is a subreaper, a descendant whose parent dies (double fork,
``nohup ... &``, ``setsid``, daemons) is re-parented to T instead of escaping
to the container's PID 1; while T lives, every process of the job is a
descendant of T. Killing the job (:data:`KILLER`, from a second exec) is then:
kill every child of T or W except W itself, and repeat until there are none.
Each round, the children of the processes just killed become children of T
and are found by the next round. C leads its own process group, and a group
kill is atomic against ``fork`` (a fork racing it fails), so a fork bomb
inside C's group is stopped in one go. W is spared because tini exits as soon
as its own child exits, and an early exit of T would hand the rest of the
tree to PID 1. Once C is gone, W runs the same clean-up (so nothing a command
starts outlives it) and exits with C's status; then T exits with it.

C runs in its own session so that ``kill 0`` or ``kill -- -$$`` in a script
cannot hit W.

Limits (each bounded by the container: its pids, memory and CPU caps, and
its removal by ``destroy``, the idle watchdog or the start-up sweep):

* T and W run as the same unprivileged user as the command, so a command that
  deliberately kills W or T by pid ends its run at once and hands whatever it
  still runs to the container's PID 1, where nothing tracks it any more.
  (Running T and W as root would prevent it, but would put a root process,
  with the caller's environment, in every sandbox.)
* Between one round's scan and its kills a process can fork a child outside
  C's group; the next round finds it (at most 400 rounds).

The host learns T and W from the first line W writes to stdout (written before
the command starts, so the command cannot forge it) and the killer checks them
again before killing: T is named docker-init, W is T's child, and T is an exec
root (parent pid 0), a child of the container's executor (named smcp-executor:
the fast path of :mod:`app.runtime.exec.protocol` starts the same job argv there),
or was handed to the container's PID 1 when that executor died; so a pid
recycled after the job ended is left alone.

The killer itself is a process, and a job that holds every pid the container
may have (a fork bomb that keeps retrying) leaves it none: the backend then
retries, and as a last resort restarts the container (see ``DockerBackend``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio

INIT = "/sbin/docker-init"  # tini, bind-mounted by Docker into every container with init=True

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def _compact(script: str) -> str:
    # A shorter argv for anyone running `ps` in the container; no line of these
    # scripts continues a quoted string, so stripping indentation is safe.
    return "\n".join(line.strip() for line in script.splitlines() if line.strip())


# Kill every process whose parent is $1 (T) or $2 (W), except W and this shell;
# repeat until none is left. Builtins only (no fork per process, and none at all
# if the pids limit is reached); /proc/PID/status and not /proc/PID/stat, whose
# command name may hold spaces, parens and newlines.
_KILL_TREE = r"""
_smcp_kill_tree() {
  _t=$1 _w=$2 _n=0
  while [ "$_n" -lt 400 ]; do
    _n=$((_n + 1)) _hit=
    for _d in /proc/[0-9]*; do
      _p=${_d#/proc/}
      if [ "$_p" = "$_w" ] || [ "$_p" = "$$" ]; then continue; fi
      _st= _pp=
      while read -r _k _v _r; do
        case $_k in
          State:) _st=$_v ;;
          PPid:) _pp=$_v; break ;;
        esac
      done 2>/dev/null <"$_d/status"
      case $_st in ''|Z|X) continue ;; esac
      if [ "$_pp" = "$_t" ] || [ "$_pp" = "$_w" ]; then
        kill -9 -"$_p" 2>/dev/null
        kill -9 "$_p" 2>/dev/null && _hit=1
      fi
    done
    [ -n "$_hit" ] || return 0
    sleep 0.02 2>/dev/null || :
  done
  return 1
}
"""

# W. $1 is the command. PATH is pinned for W's own tools, the command gets the
# caller's PATH back.
SUPERVISOR = _compact(
    _KILL_TREE
    + r"""
printf '%s %s\n' "$PPID" "$$"
_path=$PATH
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
_s=
for _c in /usr/bin/setsid /bin/setsid; do
  if [ -x "$_c" ]; then _s=$_c; break; fi
done
if [ -n "$_s" ]; then
  PATH=$_path "$_s" /bin/sh -c "$1"
else
  PATH=$_path /bin/sh -c "$1"
fi
_rc=$?
_smcp_kill_tree "$PPID" "$$"
exit "$_rc"
"""
)

# The second exec: $1 = T, $2 = W. Exit 0 when the job was running and is now
# dead, 3 when it was not running any more, 4 when its tree would not empty.
# Nothing forks before the kills (the pause between rounds may fail, harmlessly):
# a job that filled the pids limit must not make the check or the kills fail.
KILLER = _compact(
    _KILL_TREE
    + r"""
_status() {
  _name= _pp=
  while read -r _k _v _r; do
    case $_k in
      Name:) _name=$_v ;;
      PPid:) _pp=$_v; break ;;
    esac
  done 2>/dev/null <"/proc/$1/status"
}
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
_status "$2"
_wpp=$_pp
_status "$1"
_tname=$_name _ok=
case $_pp in
  0|1) _ok=1 ;;
  *) _status "$_pp"; [ "$_name" = smcp-executor ] && _ok=1 ;;
esac
if [ -n "$_ok" ] && [ "$_tname" = docker-init ] && [ "$_wpp" = "$1" ]; then
  _smcp_kill_tree "$1" "$2" || exit 4
  exit 0
fi
exit 3
"""
)


def job_argv(command: str) -> list[str]:
    """The exec argv that runs ``command`` as a killable job (see the module doc)."""
    return [INIT, "-s", "--", "/bin/sh", "-c", SUPERVISOR, "sandbox-mcp-job", command]


def killer_argv(root_pid: int, supervisor_pid: int) -> list[str]:
    """The exec argv that kills the job whose T and W are these (see the module doc)."""
    return ["/bin/sh", "-c", KILLER, "sandbox-mcp-kill", str(root_pid), str(supervisor_pid)]


_ANNOUNCEMENT = re.compile(rb"([1-9][0-9]{0,9}) ([1-9][0-9]{0,9})")
_ANNOUNCEMENT_MAX = 32


class CappedBuffer:
    """Keeps at most ``cap`` bytes of a stream: its first quarter and its last three quarters.

    A failing build or test run says why at the end of its output, so the end is what
    must survive a cap; the start (what ran, with which versions) is kept too. What fell
    between is counted, and ``text()`` says so where it was.
    """

    def __init__(self, cap: int) -> None:
        self._head_cap = cap // 4
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        # Chunks, trimmed from the left: each byte is copied at most once more.
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.omitted = 0

    @classmethod
    def restored(cls, cap: int, head: bytes, tail: bytes, omitted: int) -> CappedBuffer:
        """The buffer another ``CappedBuffer`` of ``cap`` (the executor's) ended as.

        Raises:
            ValueError: the parts do not fit ``cap`` (a garbled or forged answer).
        """
        buffer = cls(cap)
        if len(head) > buffer._head_cap or len(tail) > buffer._tail_cap or omitted < 0:
            raise ValueError("output parts larger than their cap")
        if (omitted or tail) and len(head) < buffer._head_cap:
            raise ValueError("output tail before a full head")
        buffer._head += head
        if tail:
            buffer._tail.append(tail)
            buffer._tail_len = len(tail)
        buffer.omitted = omitted
        return buffer

    @property
    def truncated(self) -> bool:
        return self.omitted > 0

    def add(self, chunk: bytes) -> None:
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        while self._tail_len > self._tail_cap:
            excess = self._tail_len - self._tail_cap
            first = self._tail[0]
            cut = min(excess, len(first))
            if cut == len(first):
                self._tail.popleft()
            else:
                self._tail[0] = first[cut:]
            self._tail_len -= cut
            self.omitted += cut

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = b"".join(self._tail).decode("utf-8", errors="replace")
        if not self.omitted:
            return head + tail
        return f"{head}\n[... {self.omitted} bytes left out ...]\n{tail}"


class Announcement:
    """Splits W's first stdout line ("T W") off the command's own output."""

    def __init__(self) -> None:
        self._head = bytearray()
        self.done = False
        self.pids: tuple[int, int] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Take stdout bytes; return those that belong to the command's output."""
        if self.done:
            return chunk
        self._head += chunk
        line, newline, rest = bytes(self._head).partition(b"\n")
        if newline:
            match = _ANNOUNCEMENT.fullmatch(line)
            self.done = True
            if match:
                self.pids = (int(match.group(1)), int(match.group(2)))
                return rest
            return bytes(self._head)
        if len(self._head) > _ANNOUNCEMENT_MAX:
            self.done = True
            return bytes(self._head)
        return b""

    def flush(self) -> bytes:
        """At the end of the stream: whatever was held back and is output after all."""
        if self.done:
            return b""
        self.done = True
        return bytes(self._head)


@dataclass(eq=False)
class Exec:
    """A running command, as the backend tracks it (in memory)."""

    container_id: str
    job_id: str
    pids: tuple[int, int] | None = None
    reason: Literal["timeout", "cancel"] | None = None
    was_running: bool = False
    eof: bool = False
    # On the fast path: asks the job's executor to kill its tree (True: it was
    # running; None: no answer, kill it another way). See app.runtime.exec.protocol.
    fast_kill: Callable[[], Awaitable[bool | None]] | None = None
    announced: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    finished: anyio.Event = field(default_factory=anyio.Event)
    settled: anyio.Event = field(default_factory=anyio.Event)


class ExecTable:
    """Running jobs by (container, job id)."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], Exec] = {}

    def add(self, container_id: str, job_id: str) -> Exec | None:
        """Register a job; None if one with that id already runs in that container."""
        key = (container_id, job_id)
        if key in self._jobs:
            return None
        job = self._jobs[key] = Exec(container_id, job_id)
        return job

    def get(self, container_id: str, job_id: str) -> Exec | None:
        return self._jobs.get((container_id, job_id))

    def discard(self, job: Exec) -> None:
        if self._jobs.get((job.container_id, job.job_id)) is job:
            del self._jobs[(job.container_id, job.job_id)]

    def __len__(self) -> int:
        return len(self._jobs)
