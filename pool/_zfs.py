"""The one way ``pool/`` talks to ZFS: the ``zfs``/``zpool`` commands.

Commands run as asyncio subprocesses (argv, never a shell) under ``LC_ALL=C``
so their messages can be classified. A failure becomes a :class:`PoolError`
whose details hold the command and a short summary of its stderr; callers
never see a raw ``CalledProcessError`` or traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

import structlog

from pool.errors import PoolError, PoolErrorCode

logger = structlog.get_logger(__name__)

COMMAND_TIMEOUT = 120.0
_STDERR_LIMIT = 400

# Substrings of zfs/zfs-fuse/OpenZFS messages, checked in order.
_CLASSIFY: tuple[tuple[str, PoolErrorCode], ...] = (
    ("failed to initialize zfs library", "ZFS_UNAVAILABLE"),
    ("zfs-fuse daemon is running", "ZFS_UNAVAILABLE"),
    ("/dev/zfs", "ZFS_UNAVAILABLE"),
    ("no such pool", "ZFS_POOL_NOT_FOUND"),
    ("dataset does not exist", "ZFS_DATASET_NOT_FOUND"),
    ("dataset is busy", "ZFS_DATASET_BUSY"),
    ("target is busy", "ZFS_DATASET_BUSY"),
    ("umount failed", "ZFS_DATASET_BUSY"),
)


def summarise(stderr: str) -> str:
    """Squash command stderr into one short line for messages and logs."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = "; ".join(lines) or "no error output"
    return text if len(text) <= _STDERR_LIMIT else text[: _STDERR_LIMIT - 3] + "..."


def _failure(argv: tuple[str, ...], returncode: int | None, stderr: str) -> PoolError:
    summary = summarise(stderr)
    command = " ".join(argv)
    code: PoolErrorCode = "ZFS_COMMAND_FAILED"
    lowered = summary.lower()
    for needle, candidate in _CLASSIFY:
        if needle in lowered:
            code = candidate
            break
    details = {"command": command, "returncode": returncode, "stderr": summary}
    if code == "ZFS_UNAVAILABLE":
        message = (
            f"ZFS is not available ({summary}); start the ZFS service "
            "(zfs-fuse daemon or kernel module) or use the dir slot backend."
        )
    else:
        message = f"`{command}` failed: {summary}"
    return PoolError(code, message, details)


async def run(*argv: str) -> str:
    """Run a command (normally ``zfs ...`` or ``zpool ...``) and return its stdout.

    Raises:
        PoolError: ``ZFS_UNAVAILABLE`` when the binary or daemon is missing,
            ``ZFS_POOL_NOT_FOUND`` / ``ZFS_DATASET_NOT_FOUND`` /
            ``ZFS_DATASET_BUSY`` when stderr says so, ``ZFS_COMMAND_FAILED``
            otherwise, including a command still running after
            :data:`COMMAND_TIMEOUT` seconds (a wedged zfs-fuse daemon).
    """
    started = time.perf_counter()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "LC_ALL": "C"},
        )
    except FileNotFoundError as exc:
        raise PoolError(
            "ZFS_UNAVAILABLE",
            f"The `{argv[0]}` command was not found; install ZFS or use the dir slot backend.",
            {"command": " ".join(argv)},
        ) from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT)
    except TimeoutError:
        proc.kill()
        # A zfs command stuck in the kernel (D state) ignores SIGKILL; don't hang on it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
        raise _failure(argv, None, f"timed out after {COMMAND_TIMEOUT:g} s") from None
    ms = round((time.perf_counter() - started) * 1000, 1)
    logger.debug("zfs.command", argv=list(argv), returncode=proc.returncode, ms=ms)
    if proc.returncode != 0:
        raise _failure(argv, proc.returncode, err.decode(errors="replace"))
    return out.decode(errors="replace")


@dataclass(frozen=True)
class Dataset:
    """Properties of one dataset or snapshot, as parsable (``-p``) strings."""

    name: str
    props: dict[str, str]

    def get(self, prop: str) -> str:
        return self.props.get(prop, "-")


async def get_tree(root: str, props: tuple[str, ...], *, depth: int) -> dict[str, Dataset]:
    """Read ``props`` of ``root`` and everything up to ``depth`` levels below it.

    One ``zfs get -r -d`` call, because looking 500 slots up one by one costs
    ~10 ms each while one recursive listing of them costs ~0.2 s. Snapshots
    of a child are one level deeper than the child itself.
    """
    out = await run(
        "zfs", "get", "-H", "-p", "-r", "-d", str(depth), "-o", "name,property,value",
        ",".join(props), root,
    )  # fmt: skip
    tree: dict[str, Dataset] = {}
    for line in out.splitlines():
        name, prop, value = line.split("\t", 2)
        tree.setdefault(name, Dataset(name, {})).props[prop] = value
    return tree


async def get_one(name: str, props: tuple[str, ...]) -> Dataset:
    """Read ``props`` of one dataset by name (cheap whatever the pool holds)."""
    tree = await get_tree(name, props, depth=0)
    return tree[name]


async def destroy(name: str, *, attempts: int = 6, first_delay: float = 0.2) -> None:
    """``zfs destroy -r`` with retries while the dataset is busy.

    A mounted dataset that a process still uses fails first with "umount
    failed", then with "dataset is busy", and succeeds once the user is gone,
    so busy failures are retried with doubling delays; others are not.
    """
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            await run("zfs", "destroy", "-r", name)
        except PoolError as exc:
            if exc.code == "ZFS_DATASET_NOT_FOUND":
                return
            if exc.code != "ZFS_DATASET_BUSY" or attempt == attempts:
                raise
            logger.info("zfs.destroy_busy", dataset=name, attempt=attempt, retry_in=delay)
            await asyncio.sleep(delay)
            delay *= 2
        else:
            return
