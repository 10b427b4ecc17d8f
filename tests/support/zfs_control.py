"""A zfs-fuse of the test's own, for the fault test that stops it and starts it again
(tests/e2e/test_zfs_fuse_restart.py): never the machine's shared zfs-fuse, whose
mounts belong to everyone else on the machine.

zfs-fuse is one daemon per mount namespace, not per machine: the daemon and every
``zfs``/``zpool`` command meet at a socket whose path is compiled in
(/var/run/zfs/zfs_socket), the daemon takes a lock compiled in
(/var/lock/zfs/zfs_lock) and imports the pools listed in a cache compiled in
(/var/lib/zfs/zpool.cache). So a holder process started with ``unshare --mount
--propagation private`` puts a private tmpfs on each of those three folders, and a
zfs-fuse started in that namespace (``nsenter --mount``) is the one every ``zfs``
command run there reaches; outside it, they still reach the shared one. Its pool,
under a unique name, lives in a small sparse file of the test's own, and the
private cache lets the restarted daemon import it again, as the shared daemon
imports its pools.

Its mounts exist in that namespace only, so whatever uses them runs there too
(``enter`` prefixes a command with the ``nsenter`` that does it): ``provision``, the
server under test, and a dockerd of the test's own (dockerd_control, given
``namespace_pid``) whose containers bind-mount the datasets. The namespace starts as
a copy of the machine's mounts; the copies of the shared zfs-fuse's mounts are
detached at once, so the namespace never holds one of the shared daemon's
file systems. The test process itself stays outside (setns needs a single thread):
it reads the namespace's paths through ``/proc/<holder>/root`` (``path``).

``private_zfs`` stops the daemon, the holder (so the namespace and its mounts go)
and deletes the pool's file however the test ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from daemon_proc import wait_until

STOP_TIMEOUT_S = 30
START_TIMEOUT_S = 60
POOL_SIZE = 256 * 1024 * 1024  # sparse: a few MiB are written

# The folders whose paths zfs-fuse has compiled in, each a tmpfs of the namespace.
# The lock and the socket: a second daemon in the namespace neither exits on the
# shared daemon's lock nor answers the shared daemon's clients; the cache: the
# private daemon imports only the private pool, the shared cache is never written.
_PRIVATE_FOLDERS = ("/var/run/zfs", "/var/lock/zfs", "/var/lib/zfs")
_HOLDER = """set -e
for folder in "$@"; do
  mkdir -p "$folder"
  mount -t tmpfs -o mode=0700,size=4m sbx-test-zfs "$folder"
done
echo ready
exec cat >/dev/null
"""


@dataclass
class PrivateZfs:
    holder: subprocess.Popen[bytes]
    pool: str
    mountpoint: Path
    log: Path
    daemon: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def enter(self) -> list[str]:
        """The prefix that runs a command in the namespace (in the caller's folder)."""
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", f"--wd={os.getcwd()}"]

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.enter, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def zfs(self, *args: str) -> str:
        done = self.run("zfs", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def answers(self) -> bool:
        return self.run("zpool", "list", "-H", timeout=15).returncode == 0

    def path(self, inside: Path) -> Path:
        """``inside`` (absolute) as the namespace sees it, from outside it."""
        return Path(f"/proc/{self.holder.pid}/root") / inside.relative_to("/")

    def mounts(self) -> list[str]:
        """The namespace's zfs-fuse mount points (none once the holder has gone)."""
        try:
            return fuse_zfs_mounts(Path(f"/proc/{self.holder.pid}/mounts"))
        except OSError:
            return []

    def start(self) -> None:
        with self.log.open("ab") as out:
            # A session of its own: a ^C to the test run does not reach it first.
            self.daemon = subprocess.Popen(
                [*self.enter, "zfs-fuse", "--no-daemon", "--no-kstat-mount"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        daemon = self.daemon
        wait_until(
            lambda: daemon.poll() is not None or self.answers(),
            START_TIMEOUT_S,
            f"the test's zfs-fuse did not answer (log: {self.log})",
        )
        assert daemon.poll() is None, self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM (SIGKILL if it does not stop); then the FUSE mounts it leaves dead
        are unmounted lazily, deepest first, as an operator would before starting it
        again."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        for point in sorted(self.mounts(), reverse=True):
            self.run("umount", "-l", point)

    def restart(self) -> None:
        """Stop the daemon and start it again; it answers ``zpool list`` on return.
        What it mounts by itself is what the server under test gets."""
        self.stop()
        self.start()


def fuse_zfs_mounts(mounts: Path = Path("/proc/self/mounts")) -> list[str]:
    points = []
    for line in mounts.read_text().splitlines():
        _, point, kind = line.split(" ")[:3]
        if kind == "fuse.zfs":
            points.append(point.replace("\\040", " "))
    return points


def shared_zfs_fuse() -> set[int]:
    """The zfs-fuse processes of this process's mount namespace (the machine's shared
    one): a private zfs-fuse is in another namespace."""
    own = os.readlink("/proc/self/ns/mnt")
    pids = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                entry.name.isdigit()
                and (entry / "comm").read_text().strip() == "zfs-fuse"
                and os.readlink(entry / "ns" / "mnt") == own
            ):
                pids.add(int(entry.name))
    return pids


@contextlib.contextmanager
def private_zfs(work: Path) -> Iterator[PrivateZfs]:
    """A running zfs-fuse of this test's own in a mount namespace of its own, with a
    pool mounted under ``work`` (an empty folder for its file, mounts and log)."""
    assert os.geteuid() == 0, "a zfs-fuse of the test's own needs root: run as root (CI does)"
    assert Path("/dev/fuse").exists(), "/dev/fuse is missing: zfs-fuse cannot run here"
    pool = f"sbxtest{uuid.uuid4().hex[:8]}"
    vdev, mountpoint = work / "pool.vdev", work / "mnt"
    mountpoint.mkdir()
    with vdev.open("wb") as sparse:
        sparse.truncate(POOL_SIZE)
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--",
         "sh", "-c", _HOLDER, "holder", *_PRIVATE_FOLDERS],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    zfs = PrivateZfs(holder, pool, mountpoint / pool, work / "zfs-fuse.log")
    namespace = ""
    try:
        assert holder.stdout is not None
        ready = holder.stdout.readline()  # the setup's few commands, or EOF if it failed
        assert ready == b"ready\n", f"the namespace's setup failed (exit {holder.wait(10)})"
        namespace = os.readlink(f"/proc/{holder.pid}/ns/mnt")
        for point in sorted(zfs.mounts(), reverse=True):  # the shared daemon's, copied
            done = zfs.run("umount", "-l", point)
            assert done.returncode == 0, done.stderr
        zfs.start()
        created = zfs.run("zpool", "create", "-f", "-m", str(zfs.mountpoint), pool, str(vdev))
        assert created.returncode == 0, created.stderr
        yield zfs
    finally:
        # The pool's only records are the private cache and its file, both gone below;
        # destroying it first is tidiness, not needed: a "busy" answer is not waited on.
        if zfs.daemon is not None and zfs.daemon.poll() is None:
            zfs.run("zpool", "destroy", "-f", pool, timeout=30)
        zfs.stop()
        if holder.stdin is not None:
            holder.stdin.close()  # its `cat` ends: the last process of the namespace
        try:
            holder.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
        vdev.unlink(missing_ok=True)
        if namespace:  # gone with its last process, and its mounts with it
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not in_namespace(namespace), STOP_TIMEOUT_S, "")
            left = in_namespace(namespace)
            assert not left, f"processes left in the test's mount namespace: {left}"


def in_namespace(namespace: str) -> list[str]:
    """The processes (pid and name) in mount namespace ``namespace``."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and os.readlink(entry / "ns" / "mnt") == namespace:
                found.append(f"{entry.name} {(entry / 'comm').read_text().strip()}")
    return found
