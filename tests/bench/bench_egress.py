"""Benchmark: what does a connection through the egress proxy cost, against a direct one?

    sudo uv run python tests/bench/bench_egress.py [--samples 60]

Sets up the egress tests' outside world (a registry with a public-looking address in a
network namespace: ``tests/support/egress_testkit.py``), starts the proxy of network
"restricted" (``EgressProxy``, real Squid), and runs the same client in the same image
in two containers, in the same run:

* **proxied**: on the restricted network, through Squid (CONNECT, then TLS);
* **direct**: on Docker's default bridge, the registry's name pinned with ``--add-host``.

Each sample is one new connection (``urllib.request.urlopen(...).read()`` of a small
page over https: TCP, TLS, one GET), timed inside the container, samples interleaved
between the two containers so drift hits both alike. Prints p50 and p95 of each and the
difference per connection. Needs root (iptables, ip netns), Docker and the sandbox
images; everything it makes is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import docker
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from docker_testkit import exec_output
from egress_fakes import MemoryUsage
from egress_testkit import PYTHON_IMAGE, outside_world

from app.egress.proxy import EgressConfig, EgressProxy

CLIENT = """
import json, sys, time, urllib.request
times = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    urllib.request.urlopen("https://pypi.org/simple/tinypkg/", timeout=10).read()
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(samples: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory() as work, outside_world(Path(work)) as world:
        proxy = EgressProxy(
            EgressConfig(
                ceiling=("pypi.org",),
                max_bytes=1 << 40,
                deployment="bench-egress",
                test_hosts=(("pypi.org", world.registry),),
            ),
            usage=MemoryUsage(),  # no database here: the bytes are only shown
        )
        await proxy.start()
        client = docker.from_env()
        made = []
        try:
            proxied = client.containers.run(
                PYTHON_IMAGE,
                ["sleep", "infinity"],
                detach=True,
                network=proxy.network,
                environment=proxy.env(),
                labels={
                    proxy.allow_label(): "pypi.org",
                    f"{proxy.config.label_prefix}.experiment": "exp_bench",
                },
            )
            made.append(proxied)
            await proxy.attach(client.api, proxied.id)
            direct = client.containers.run(
                PYTHON_IMAGE,
                ["sleep", "infinity"],
                detach=True,
                extra_hosts={"pypi.org": world.registry},
            )
            made.append(direct)
            times: dict[str, list[float]] = {"proxied": [], "direct": []}
            rounds, per_round = max(1, samples // 10), min(10, samples)
            for _ in range(rounds):  # interleaved
                for name, container in (("proxied", proxied), ("direct", direct)):
                    code, output = await asyncio.to_thread(
                        exec_output,
                        client.api,
                        container.id,
                        ["python3", "-c", CLIENT, str(per_round)],
                    )
                    assert code == 0, output.decode()
                    times[name] += json.loads(output)
            print(f"One new https connection + GET, {len(times['direct'])} samples each:")
            for name, values in times.items():
                print(
                    f"  {name:<8} p50 {pct(values, 0.5) * 1000:6.2f} ms   "
                    f"p95 {pct(values, 0.95) * 1000:6.2f} ms   "
                    f"mean {statistics.fmean(values) * 1000:6.2f} ms"
                )
            await proxy.take_notice(proxied.id)  # reads the log up to now
            usage = await proxy.usage_of("exp_bench")
            assert usage.bytes > 0, "the proxied container went through the proxy"
            print(f"  (through the proxy: {usage.bytes:,} bytes, {usage.refused} refused)")
            extra = pct(times["proxied"], 0.5) - pct(times["direct"], 0.5)
            ratio = pct(times["proxied"], 0.5) / pct(times["direct"], 0.5)
            print(f"  the proxy adds {extra * 1000:.2f} ms a connection at p50 (x{ratio:.2f})")
        finally:
            for container in made:
                container.remove(force=True)
                await proxy.detach(container.id)
            client.close()
            await proxy.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=60)
    asyncio.run(main(parser.parse_args().samples))
