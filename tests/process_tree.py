"""A command run as a terminal runs it: in its own process group, its output in files, its
descendants found through /proc, and Ctrl-C sent to the whole group as a terminal sends it."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from specroute.children import spawn, stop


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...)."""
    parents = {
        int(p.name): _parent_of(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()
    }
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def still_running(pids: set[int], within: float = 10.0) -> list[int]:
    """Those of `pids` still running after up to `within` seconds (an orphan is reaped by init
    a moment after its parent exits)."""
    deadline = time.monotonic() + within
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]


class Terminal:
    """`python -m specroute ARGS` in a new session, as a shell in a terminal would start it."""

    def __init__(self, args: Sequence[str], tmp_path: Path, pass_fds: Sequence[int] = ()) -> None:
        self.out_path, self.err_path = tmp_path / "stdout", tmp_path / "stderr"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.process = spawn(
                [sys.executable, "-m", "specroute", *args],
                env={"PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=err,
                new_session=True,
                pass_fds=pass_fds,
            )

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out + self.err:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"no {text!r}; status {self.process.poll()}\n{self.out}{self.err}"
                )
            time.sleep(0.2)

    def ctrl_c(self) -> None:
        """SIGINT to the whole process group, as a terminal sends it."""
        os.killpg(self.process.pid, signal.SIGINT)

    def close(self, leftover: set[int]) -> None:
        """Stop the command and anything it left (a failed test must not leak processes)."""
        stop(self.process, grace_s=20, kill_group=True)
        for pid in leftover:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
