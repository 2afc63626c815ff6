"""A target that gives no HTTP answer: closed-loop users back off instead of flooding it, the
failures are counted, and the bench exits 1 when nothing succeeded."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import refused_url

from specroute.bench.backoff import ConnectBackoff
from specroute.cli import main


@contextlib.contextmanager
def refusing_server() -> Iterator[tuple[str, list[int]]]:
    """A port that accepts each connection and closes it at once; counts the attempts."""
    attempts = [0]
    stop = threading.Event()
    sock = socket.create_server(("127.0.0.1", 0), backlog=512)
    sock.settimeout(0.05)

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = sock.accept()
                attempts[0] += 1
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", attempts
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


def test_trace_against_a_dead_target_exits_1_after_fewer_than_200_attempts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with refusing_server() as (url, attempts):
        status = main(
            ["bench", "trace", "scenarios/policy-eval.toml", url, "--duration-scale", "0.01"]
        )
    err = capsys.readouterr().err
    assert status == 1
    assert 0 < attempts[0] < 200
    assert "requests failed" in err
    assert "no request succeeded" in err


def test_trace_against_a_closed_port_exits_1_and_counts_the_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with refused_url() as url:
        argv = ["bench", "trace", "scenarios/policy-eval.toml", url, "--duration-scale", "0.002"]
        status = main(argv)
    err = capsys.readouterr().err
    assert status == 1
    assert "specroute bench trace: no request succeeded" in err
    failed = next(line for line in err.splitlines() if "requests failed" in line)
    count, _, total = failed.split(": ")[1].split()[:3]
    assert int(count) == int(total) > 0


def test_backoff_lets_one_probe_through_at_doubling_intervals_up_to_the_cap() -> None:
    gate = ConnectBackoff(first_s=1.0, cap_s=4.0, give_up_s=100.0)
    assert gate.wait_s(0.0) == 0.0  # reachable: everyone sends
    gate.record(reached=False, now=0.0)
    assert gate.wait_s(0.5) == 0.5  # the first pause
    tries, now = [], 0.5
    while now < 20.0:
        if gate.wait_s(now) == 0.0:
            assert gate.wait_s(now) != 0.0  # one probe at a time
            tries.append(now)
            gate.record(reached=False, now=now)
        now += 0.5
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert tries[0] == 1.0
    assert gaps[:4] == [2.0, 4.0, 4.0, 4.0]
    gate.record(reached=True, now=now)
    assert gate.wait_s(now) == 0.0
    assert gate.wait_s(now) == 0.0  # an answer resumes every user


def test_backoff_gives_a_level_up_after_give_up_s_and_the_next_level_probes_at_once() -> None:
    gate = ConnectBackoff(first_s=0.1, cap_s=1.0, give_up_s=2.0)
    gate.record(reached=False, now=0.0)
    assert gate.wait_s(1.0) == 0.0
    gate.record(reached=False, now=1.0)
    assert gate.wait_s(2.5) is None
    gate.start_level(3.0)
    assert gate.wait_s(3.0) == 0.0


def test_profile_of_a_run_where_nothing_succeeded_exits_1_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, profile = tmp_path / "dead.json", tmp_path / "profile.json"
    with refused_url() as url:
        argv = ["bench", "sweep", url, "-c", "1", "-n", "1", "--warmup", "0"]
        assert main([*argv, "--json", str(result)]) == 1
    assert main(["bench", "profile", str(result), "-o", str(profile)]) == 1
    assert "no closed-loop level with a successful request" in capsys.readouterr().err
    assert not profile.exists()
