"""A terminal's Ctrl-C (SIGINT to the whole process group) stops `specroute demo` and
`specroute launch --emulate` with status 0 or 130, no traceback, and no child left running."""

from __future__ import annotations

from pathlib import Path

import pytest
from process_tree import Terminal, descendants, still_running
from servers import launch_ports

from specroute.children import bound_socket


def _ctrl_c_stops_cleanly(terminal: Terminal, ready: str) -> None:
    children: set[int] = set()
    try:
        terminal.wait_for(ready)
        children = descendants(terminal.process.pid)
        assert children, "the command started no children"
        terminal.ctrl_c()
        status = terminal.process.wait(timeout=60)
        assert status in (0, 130), terminal.err
        assert "Traceback" not in terminal.err + terminal.out
        assert not still_running(children)
    finally:
        terminal.close(children)


@pytest.mark.timeout(150)
def test_ctrl_c_on_the_demo_stops_everything_without_a_traceback(tmp_path: Path) -> None:
    with bound_socket() as sock:  # the proxy's, held from here on
        port, fd = sock.getsockname()[1], sock.fileno()
        terminal = Terminal(["demo", "--port", str(port), "--fd", str(fd)], tmp_path, [fd])
    _ctrl_c_stops_cleanly(terminal, "Serving until Ctrl-C.")
    assert "Stopped the proxy and the emulated servers." in terminal.out


@pytest.mark.timeout(150)
def test_ctrl_c_on_launch_emulate_stops_everything_without_a_traceback(tmp_path: Path) -> None:
    port, base = launch_ports(2)
    args = ["launch", "--emulate", "--steps", "1,2", "--port", str(port)]
    args += ["--base-port", str(base), "--log-dir", str(tmp_path / "logs")]
    terminal = Terminal(args, tmp_path)
    _ctrl_c_stops_cleanly(terminal, "Ctrl-C (or SIGTERM) stops everything.")
    assert "stopping (draining the proxy's streams first)" in terminal.err
