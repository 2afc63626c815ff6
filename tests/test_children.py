"""The process helper with real child processes: ready waits, early exits, stops that escalate."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import refused_url

from specroute.children import (
    ChildExited,
    NotReady,
    Output,
    bound_socket,
    free_port,
    free_ports,
    spawn,
    stop,
    stop_async,
    wait_exit,
    wait_ready,
    wait_ready_sync,
)

# Serves HTTP 200 on the inherited socket argv[2] after sleeping argv[1] seconds; gone after a
# minute at the latest.
LATE_SERVER = """
import http.server, socket, sys, threading, time
time.sleep(float(sys.argv[1]))
handler = http.server.SimpleHTTPRequestHandler
server = http.server.HTTPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
server.socket = socket.socket(fileno=int(sys.argv[2]))
server.server_activate()
threading.Timer(60, server.shutdown).start()
server.serve_forever()
"""
# Ignores SIGTERM, says so on stdout, starts a grandchild that ignores it too, lives a minute.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
grandchild = subprocess.Popen([sys.executable, "-c", code])
print(grandchild.pid, flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def child(
    code: str,
    *args: str,
    stdout: Output = None,
    stderr: Output = None,
    new_session: bool = False,
    sock: socket.socket | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -c CODE ARGS`, stopped (and its group killed) when the block ends; `sock` is
    inherited, its descriptor the last argument."""
    argv = [sys.executable, "-c", code, *args]
    fds = [] if sock is None else [sock.fileno()]
    process = spawn(
        [*argv, *map(str, fds)], stdout=stdout, stderr=stderr, new_session=new_session,
        pass_fds=fds,
    )  # fmt: skip
    try:
        yield process
    finally:
        stop(process, grace_s=5, kill_group=new_session)


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped (in a container without an init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_free_port_can_be_bound_and_listened_on() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert sock.getsockname()[1] == port


def _kernel_port() -> int:
    """A port `bind(0)` gives, without `free_ports`' record."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_port_the_kernel_hands_out_twice_is_handed_out_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two children's ports picked one after the other: the kernel may give a port let go to
    the next `bind(0)`, and without a record both children got it (a benchmark's proxy and
    another pool's server)."""
    first = second = _kernel_port()
    while second == first:
        second = _kernel_port()
    picks = iter([first, first, second])  # the same port twice, then another
    real = socket.socket

    class Kernel(real):  # type: ignore[misc, valid-type]
        def bind(self, address: tuple[str, int]) -> None:
            host, port = address
            super().bind((host, next(picks) if port == 0 else port))

    monkeypatch.setattr(socket, "socket", Kernel)
    assert free_port() == first
    assert free_port() == second
    monkeypatch.undo()
    bases = [free_ports(3) for _ in range(20)]
    spans = [p for base in bases for p in range(base, base + 3)]
    assert len(set(spans)) == len(spans)


def test_wait_ready_returns_once_a_late_server_answers(tmp_path: Path) -> None:
    with bound_socket() as sock, child(LATE_SERVER, "0.5", sock=sock) as process:
        port = sock.getsockname()[1]
        wait_ready_sync(f"http://127.0.0.1:{port}/", process=process)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200


def test_a_child_that_exits_first_fails_the_wait_with_its_status_and_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    code = "import sys; print('fatal: --bogus is not a flag', file=sys.stderr); sys.exit(3)"
    with log.open("wb") as out, child(code, stderr=out) as process, refused_url() as base:
        url = f"{base}/ready"
        with pytest.raises(ChildExited) as failed:
            wait_ready_sync(url, process=process, within=30, name="steps2", output=log)
    assert failed.value.status == 3
    assert "steps2 exited with status 3" in str(failed.value)
    assert "fatal: --bogus is not a flag" in str(failed.value)


def test_a_child_that_never_answers_is_not_ready_at_the_deadline(tmp_path: Path) -> None:
    with child("import time; time.sleep(60)") as process, refused_url() as base:
        url = f"{base}/ready"
        with pytest.raises(NotReady, match=r"was not ready after 0\.3 s") as failed:
            wait_ready_sync(url, process=process, within=0.3)
        assert isinstance(failed.value, TimeoutError)
        assert process.poll() is None  # the wait gives up; stopping is the caller's call


def test_connect_only_waits_for_the_port_not_for_a_200() -> None:
    code = "import socket, sys, time; s = socket.socket(fileno=int(sys.argv[1])); s.listen()"
    code += "; print('up', flush=True); time.sleep(60)"
    with bound_socket() as sock, child(code, stdout=subprocess.PIPE, sock=sock) as process:
        port = sock.getsockname()[1]
        url = f"http://127.0.0.1:{port}/ready"
        wait_ready_sync(url, process=process, connect_only=True)
        with pytest.raises(NotReady):  # it accepts connections but never answers
            wait_ready_sync(url, process=process, within=0.5)


def test_stop_ends_a_polite_child_with_the_signal_it_was_sent() -> None:
    code = "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(7))"
    code += "; print('up', flush=True); time.sleep(60)"
    with child(code, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert process.stdout.readline() == b"up\n"
        assert stop(process, sig=signal.SIGINT, grace_s=30) == 7


def test_stop_kills_a_child_that_ignores_sigterm_and_its_group() -> None:
    with child(STUBBORN, stdout=subprocess.PIPE, new_session=True) as process:
        assert process.stdout is not None
        grandchild = int(process.stdout.readline())  # both ignore SIGTERM from here on
        assert stop(process, grace_s=0.5, kill_group=True) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while not _dead(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dead(grandchild)


def test_async_wait_and_stop_report_the_exit_status() -> None:
    async def scenario() -> tuple[int, int]:
        with (
            child("import time; time.sleep(60)") as sleeper,
            child("import time; time.sleep(0.5); raise SystemExit(5)") as quitter,
        ):
            exited = await wait_exit(quitter)  # the loop watches it; no one has polled it yet
            with pytest.raises(ChildExited, match="status 5"), refused_url() as base:
                await wait_ready(f"{base}/", process=quitter)
            return exited, await stop_async(sleeper, grace_s=30)

    exited, stopped = asyncio.run(scenario())
    assert exited == 5
    assert stopped == -signal.SIGTERM
