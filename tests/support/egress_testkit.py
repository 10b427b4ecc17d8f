"""The outside world for the egress tests: package registries on an address of their own.

There is no internet here, so ``outside_world`` makes a network namespace with a
public-looking address (routed from the host over a veth pair), serves PyPI, the
npm registry and a GitHub-like git host there over https (``egress_registry.py``,
a certificate of a throwaway CA for those names), and builds images that trust
that CA. The server's proxy is told, through the test-only
``SANDBOX_MCP_EGRESS_TEST_HOSTS``, that the registry names resolve there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from e2e_server import RunningServer, start_server, stop_server
from tls_testkit import make_ca

REGISTRY_SCRIPT = Path(__file__).with_name("egress_registry.py")
# Tagged per test process: each trusts its own world's CA, and two test processes at
# once (CI's two workers) building one tag gave each other's containers the wrong CA.
PYTHON_IMAGE = f"sandbox-mcp/python-egress:e2e-{os.getpid()}"
NODE_IMAGE = f"sandbox-mcp/node-egress:e2e-{os.getpid()}"
REGISTRY_NAMES = ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "github.com")
WHEEL = "tinypkg-1.0-py3-none-any.whl"
NPM_PACKAGE = "tiny-npm-pkg"
GIT_REPO = "https://github.com/owner/tiny.git"
BIG_FILE = "big.bin"  # more than the smallest egress cap
BIG_BYTES = 1536 * 1024


@dataclass(frozen=True)
class OutsideWorld:
    registry: str  # the registry's (public-looking) address
    host: str  # the host's end of the veth pair: a public-looking address of the host

    def test_hosts(self, **others: str) -> str:
        """SANDBOX_MCP_EGRESS_TEST_HOSTS: the registry names, and ``name=address`` others."""
        pairs = [f"{name}={self.registry}" for name in REGISTRY_NAMES]
        pairs += [f"{name}={address}" for name, address in others.items()]
        return ",".join(pairs)

    def server_env(self) -> dict[str, str]:
        """A server with network "restricted" to pypi.org in this world, Python only."""
        return {
            "SANDBOX_MCP_EGRESS_PROXY": "true",
            "SANDBOX_MCP_EGRESS_ALLOWLIST": "pypi.org",
            "SANDBOX_MCP_EGRESS_TEST_HOSTS": self.test_hosts(),
            "SANDBOX_MCP_IMAGES": PYTHON_IMAGE,
            "SANDBOX_MCP_DEFAULT_IMAGE": PYTHON_IMAGE,
        }


# A restricted experiment's fetch of each URL (the argv's, else ``urls``): one line each,
# "reached URL" or "failed URL reason".
FETCH = (
    "python3 - <<'EOF'\n"
    "import sys, urllib.request\n"
    "for url in sys.argv[1:] or {urls!r}:\n"
    "    try:\n"
    "        urllib.request.urlopen(url, timeout=10).read()\n"
    "        print('reached', url)\n"
    "    except Exception as exc:\n"
    "        print('failed', url, exc)\n"
    "EOF"
)


def hold(connections: int, seconds: int, *, begin_request: bool = False) -> str:
    """A restricted experiment's command that opens ``connections`` to the proxy, writes
    how many it got into ``held`` and keeps them ``seconds``. ``begin_request``: each
    sends the start of a request and never ends it, so Squid keeps it for its
    request_timeout (5 min), not the 30 s of a connection that sent nothing."""
    begun = 'b"GET http://pypi.org/simple/ HTTP/1.1\\r\\n"' if begin_request else 'b""'
    return f"""python3 - <<'EOF'
import os, resource, socket, time
from urllib.parse import urlsplit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
proxy = urlsplit(os.environ["http_proxy"])
held = []
for _ in range({connections}):
    try:
        s = socket.create_connection((proxy.hostname, proxy.port), timeout=2)
    except OSError:
        continue
    s.sendall({begun})
    held.append(s)
open("held", "w").write(str(len(held)))
time.sleep({seconds})
EOF"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


@contextlib.contextmanager
def outside_world(work: Path) -> Iterator[OutsideWorld]:
    """The registry in a namespace of its own, and the images that trust it."""
    tag = f"{os.getpid() % 0xFFFF:04x}"
    octet, claim = _claim_octet()
    world = OutsideWorld(registry=f"44.44.{octet}.2", host=f"44.44.{octet}.1")
    namespace, outer, inner = f"smcp-reg-{tag}", f"smcpeh{tag}", f"smcpen{tag}"
    ca = make_ca(work / "ca", dns_names=list(REGISTRY_NAMES), ip_addresses=[])
    root = work / "sites"
    _publish(root)
    _build_images(work / "images", ca.ca_pem)
    sh("ip", "netns", "add", namespace)
    process = None
    try:
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", namespace)
        sh("ip", "addr", "add", f"{world.host}/32", "dev", outer)
        sh("ip", "link", "set", outer, "up")
        sh("ip", "route", "add", f"{world.registry}/32", "dev", outer, "src", world.host)
        inside = ("ip", "-n", namespace)
        sh(*inside, "addr", "add", f"{world.registry}/32", "dev", inner)
        sh(*inside, "link", "set", inner, "up")
        sh(*inside, "link", "set", "lo", "up")
        sh(*inside, "route", "add", f"{world.host}/32", "dev", inner)
        sh(*inside, "route", "add", "default", "via", world.host, "dev", inner)
        log = (work / "registry.log").open("wb")
        process = subprocess.Popen(
            [
                *("ip", "netns", "exec", namespace, sys.executable, str(REGISTRY_SCRIPT)),
                *(str(root), str(ca.cert_pem), str(ca.key_pem)),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready", (work / "registry.log").read_text()
        yield world
    finally:
        if process is not None:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        sh("ip", "netns", "del", namespace, check=False)
        sh("ip", "link", "del", outer, check=False)
        # Untagged (their layers are the base images'); kept while a container uses them.
        sh("docker", "rmi", PYTHON_IMAGE, NODE_IMAGE, check=False)
        claim.close()  # the addresses are free for another world


def _claim_octet() -> tuple[int, IO[bytes]]:
    """A third octet no other world on the machine holds (two test processes at once):
    an exclusive lock on a file per octet, held until the world is taken down."""
    start = os.getpid() % 250
    for step in range(250):
        octet = (start + step) % 250 + 2
        claim = Path(f"/tmp/smcp-egress-world-{octet}.lock").open("wb")  # noqa: SIM115
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            claim.close()
            continue
        return octet, claim
    raise AssertionError("every outside-world address range is held by another test process")


@contextlib.contextmanager
def restricted_server(
    state: Path, world: OutsideWorld, *, nofile: tuple[int, int] | None = None, **env: str
) -> Iterator[RunningServer]:
    """A real server offering network "restricted" (hosted mode; ``env`` over the world's
    settings); stopped afterwards, and its restricted network removed with it."""
    settings = {"SANDBOX_MCP_AUTH": "oauth", **world.server_env(), **env}
    server = start_server(state, nofile=nofile, **settings)
    network = None
    try:
        network = restricted_network_of(server)
        yield server
    finally:
        stop_server(server)
        if network is not None:
            remove_restricted_network(network)


def restricted_network_of(server: RunningServer) -> str:
    """The Docker network of the server's restricted experiments, as its log names it."""
    found = re.search(r'"network": "(sandbox-mcp-restricted-[^"]+)"', server.log())
    assert found is not None, server.log()[-2000:]
    return found[1]


def remove_restricted_network(network: str) -> None:
    """After a test server stopped: its restricted network, containers and firewall.

    A server leaves them (its containers outlive a restart); a test's state dir goes,
    so nothing would ever reuse them, and Docker's address pools are small.
    """
    found = sh("docker", "ps", "-aq", "--filter", f"network={network}").stdout.split()
    if found:
        sh("docker", "rm", "-f", *found)
    sh("docker", "network", "rm", network, check=False)
    chain = "SMCP-EGRESS-" + network.rsplit("-", 1)[-1]
    bridge = "smcpr-" + network.rsplit("-", 1)[-1]
    for tool in ("iptables", "ip6tables"):
        for hook in ("INPUT", "FORWARD"):
            sh(tool, "-w", "-D", hook, "-i", bridge, "-j", chain, check=False)
        sh(tool, "-w", "-F", chain, check=False)
        sh(tool, "-w", "-X", chain, check=False)
    # The connection bounds' nftables table (egress_bounds).
    sh("nft", "delete", "table", "ip", "smcp_egress_" + network.rsplit("-", 1)[-1], check=False)
    # The folder the deployment's processes shared (egress_squid.folder_root).
    shutil.rmtree(f"/run/sandbox-mcp/egress-{network.rsplit('-', 1)[-1]}", ignore_errors=True)


def _publish(root: Path) -> None:
    """A wheel on PyPI, a package on npm, a repository on the git host."""
    wheel = _wheel()
    digest = hashlib.sha256(wheel).hexdigest()
    files = root / "files.pythonhosted.org" / "packages"
    files.mkdir(parents=True)
    (files / WHEEL).write_bytes(wheel)
    (files / BIG_FILE).write_bytes(os.urandom(BIG_BYTES))
    simple = root / "pypi.org" / "simple" / "tinypkg"
    simple.mkdir(parents=True)
    (simple / "index.html").write_text(
        f'<html><body><a href="https://files.pythonhosted.org/packages/{WHEEL}'
        f'#sha256={digest}">{WHEEL}</a></body></html>\n'
    )
    tarball = _npm_tarball()
    package = root / "registry.npmjs.org" / NPM_PACKAGE
    (package / "-").mkdir(parents=True)
    (package / "-" / f"{NPM_PACKAGE}-1.0.0.tgz").write_bytes(tarball)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    url = f"https://registry.npmjs.org/{NPM_PACKAGE}/-/{NPM_PACKAGE}-1.0.0.tgz"
    version = {
        "name": NPM_PACKAGE,
        "version": "1.0.0",
        "dist": {
            "tarball": url,
            "shasum": hashlib.sha1(tarball).hexdigest(),
            "integrity": integrity,
        },
    }
    document = {
        "name": NPM_PACKAGE,
        "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": version},
    }
    (package / "index.html").write_text(json.dumps(document))
    repo = root / "github.com" / "owner" / "tiny.git"
    work = root.parent / "git-work"
    work.mkdir()
    (work / "README.md").write_text("cloned through the egress proxy\n")
    git = ("git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(work))
    sh("git", "init", "-q", "-b", "main", str(work))
    sh(*git, "add", "README.md")
    sh(*git, "commit", "-q", "-m", "first")
    sh("git", "clone", "-q", "--bare", str(work), str(repo))


def _wheel() -> bytes:
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    files["tinypkg-1.0.dist-info/RECORD"] = (record + "tinypkg-1.0.dist-info/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _npm_tarball() -> bytes:
    files = {
        "package/package.json": json.dumps(
            {"name": NPM_PACKAGE, "version": "1.0.0", "main": "index.js"}
        ).encode(),
        "package/index.js": b"module.exports = 'from the registry';\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _build_images(folder: Path, ca_pem: Path) -> None:
    """The sandbox images, trusting the test CA (nothing else added: pip is the image's)."""
    folder.mkdir()
    shutil.copy(ca_pem, folder / "test-ca.pem")
    trust = (
        "COPY test-ca.pem /etc/ssl/certs/ca-certificates.crt\n"
        "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt "
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "
        "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt "
        "PIP_DISABLE_PIP_VERSION_CHECK=1\n"
    )
    for image, base, extra in (
        (PYTHON_IMAGE, "sandbox-mcp/python:3", ""),
        (NODE_IMAGE, "sandbox-mcp/node:22", ""),
    ):
        (folder / "Dockerfile").write_text(f"FROM {base}\n{trust}{extra}")
        sh("docker", "build", "-q", "-t", image, str(folder))


async def usage_lines_of(server: RunningServer, experiment: str) -> list[str]:
    """The server's ``egress.usage`` lines for ``experiment``, waited for (120 s at most):
    its usage is recorded when its container goes, which a destroy does after its answer
    (app/experiments/removals.py)."""
    for _ in range(600):
        usage = [line for line in server.log().splitlines() if '"egress.usage"' in line]
        recorded = [line for line in usage if experiment in line]
        if recorded:
            return recorded
        await asyncio.sleep(0.2)
    return []
