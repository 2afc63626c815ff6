"""Processes and probes shared by `chaos.py` and `soak.py`: emulated backends that can be killed,
frozen and restarted on their port, the proxy as a child process, its Prometheus counters, and
what /proc says about its descriptors, memory and upstream connections. Loopback only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.samples import Sample

from specroute.bench import ApiSettings, BenchClient, RequestRecord, Sampling, SweepSettings, Target
from specroute.bench.level import LevelPlan, run_level
from specroute.children import free_port, spawn, stop, wait_ready
from specroute.prometheus import read_samples

__all__ = [
    "Emulator",
    "Proxy",
    "free_port",
    "metric_by",
    "metric_sum",
    "open_fds",
    "parse_metrics",
    "rss_bytes",
    "upstream_connections",
]

HOST = "127.0.0.1"


@dataclass
class Emulator:
    """One `specroute emulate` process on a fixed port, restartable with other fault flags."""

    steps: int
    args: list[str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    frozen: bool = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def name(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_dir / f"emulator-{self.port}.log"

    def start(self, *faults: str) -> None:
        cmd = [sys.executable, "-m", "specroute", "emulate", "--steps", str(self.steps)]
        cmd += ["--host", HOST, "--port", str(self.port), *self.args, *faults]
        with self.log.open("ab") as log:
            self.process = spawn(cmd, stdout=log, stderr=log)

    async def ready(self, within: float = 30.0) -> None:
        assert self.process is not None
        await wait_ready(self.url + "/ready", process=self.process, within=within, output=self.log)

    def kill(self) -> None:
        """Die at once, as a crashed server does (a frozen one is thawed first)."""
        if self.process is not None:
            stop(self.process, sig=signal.SIGKILL)
        self.frozen = False

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP/SIGCONT: a hung server that still holds its sockets open."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)
            self.frozen = frozen

    async def restart(self, *faults: str) -> None:
        self.kill()
        self.start(*faults)
        await self.ready()

    def stop(self) -> None:
        if self.process is not None:
            if self.frozen:
                self.freeze(False)
            stop(self.process, grace_s=10)


@dataclass
class Proxy:
    """`specroute serve --config FILE` as a child process; its log goes to a file."""

    config: Path
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def start(self) -> None:
        cmd = [sys.executable, "-m", "specroute", "serve", "--config", str(self.config)]
        cmd += ["--host", HOST, "--port", str(self.port)]
        with self.log.open("ab") as log:
            self.process = spawn(cmd, stdout=log, stderr=log)
        await wait_ready(self.url + "/ready", process=self.process, within=30.0, output=self.log)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> int | None:
        """SIGTERM, then wait: the proxy's own graceful shutdown."""
        if self.process is None:
            return None
        return stop(self.process, grace_s=60)

    async def metrics(self, client: httpx.AsyncClient) -> list[Sample]:
        return parse_metrics((await client.get(self.url + "/metrics")).text)

    async def pool(self, client: httpx.AsyncClient) -> dict[str, object]:
        reply = await client.get(self.url + "/pool")
        data: dict[str, object] = reply.json()
        return data


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of one Prometheus scrape, read by the project's one parser."""
    samples = read_samples(text)
    if samples is None:
        raise ValueError("the scrape is not Prometheus text")
    return samples


def metric_sum(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels`."""
    wanted = labels.items()
    return sum(s.value for s in samples if s.name == name and wanted <= s.labels.items())


def metric_by(samples: list[Sample], name: str, label: str) -> dict[str, float]:
    """The sum of `name` per value of `label` (series without it left out)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name and label in s.labels:
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def upstream_connections(pid: int, ports: set[int]) -> int:
    """The proxy's TCP connections to any of `ports` that are not closed yet."""
    inodes = _socket_inodes(pid)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                # 07 CLOSE: gone; everything else (established, closing) still holds the fd
                if parts[9] in inodes and remote_port in ports and parts[3] != "07":
                    count += 1
    return count


MODEL = "Qwen/Qwen3.5-122B-A10B"


async def closed_loop_through(
    url: str,
    mix: list[Sampling],
    *,
    concurrency: int,
    duration: float,
    seed: int,
    request_timeout_s: float,
    origin: float | None = None,
) -> list[RequestRecord]:
    """`concurrency` users sending the `mix` to `url` for `duration` seconds, chunks not kept."""
    settings = SweepSettings(
        targets=[Target(label="proxy", url=url)],
        mix=mix,
        api=ApiSettings(model=MODEL, timeout=request_timeout_s),
        keep_chunks=False,
    )
    plan = LevelPlan(
        url=url,
        model=MODEL,
        concurrency=concurrency,
        rate=None,
        requests=None,
        duration=duration,
        seed=seed,
    )
    async with BenchClient(connections=concurrency + 8, timeout=request_timeout_s) as client:
        records, _ = await run_level(client, settings, plan, origin=origin)
    return records
