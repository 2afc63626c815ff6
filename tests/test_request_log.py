"""`request_log_share`: every failed request keeps its `request_finished` line, an evenly spaced
share of the successes does, and the line's size is what docs/operators.md says."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import Server, start_emulator

from specroute.children import bound_socket, spawn, wait_ready_sync
from specroute.config import ConfigError, load_config
from specroute.proxy.request_log import RequestLogSampler

MODEL = "Qwen/Qwen3.5-122B-A10B"


def test_a_share_keeps_evenly_spaced_successes_and_every_failure() -> None:
    sampler = RequestLogSampler(0.25)
    kept = [sampler.keep(failed=False) for _ in range(100)]
    assert sum(kept) == 25
    assert kept[:8] == [False, False, False, True] * 2
    assert all(sampler.keep(failed=True) for _ in range(5))
    none = RequestLogSampler(0.0)
    assert not any(none.keep(failed=False) for _ in range(50))
    assert none.keep(failed=True)
    every = RequestLogSampler(1.0)
    assert all(every.keep(failed=False) for _ in range(50))


@pytest.mark.parametrize("share", ["-0.1", "1.5"])
def test_a_share_outside_0_to_1_is_a_config_error(share: str) -> None:
    with pytest.raises(ConfigError, match="request_log_share"):
        load_config(None, environ={"SPECROUTE_REQUEST_LOG_SHARE": share})


@contextlib.contextmanager
def _logged_proxy(tmp: Path, backend: Server, *flags: str) -> Iterator[tuple[str, Path]]:
    log = tmp / "proxy.log"
    with log.open("wb") as sink, bound_socket() as sock:  # the proxy listens on it
        port, fd = sock.getsockname()[1], sock.fileno()
        argv = [sys.executable, "-m", "specroute", "serve", "--backend", backend.url,
                "--port", str(port), "--fd", str(fd), *flags]  # fmt: skip
        env = {"PYTHONUNBUFFERED": "1"}
        process = spawn(argv, stdout=sink, stderr=sink, env=env, pass_fds=[fd])
        try:
            wait_ready_sync(f"http://127.0.0.1:{port}/ready", process=process, output=log)
            yield f"http://127.0.0.1:{port}", log
        finally:
            process.terminate()
            process.wait(timeout=20)


def test_the_proxy_logs_a_quarter_of_successes_and_all_failures(tmp_path: Path) -> None:
    with (
        start_emulator(1, "--time-scale", "100") as backend,
        _logged_proxy(tmp_path, backend, "--request-log-share", "0.25") as (url, log),
    ):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(12):
            assert httpx.post(url + "/v1/chat/completions", json=chat).status_code == 200
        for _ in range(2):
            bad = {**chat, "max_tokens": "many"}
            assert httpx.post(url + "/v1/chat/completions", json=bad).status_code == 400
    lines = [json.loads(x) for x in log.read_text().splitlines() if '"request_finished"' in x]
    assert [line["status"] for line in lines] == [200, 200, 200, 400, 400]
    sizes = [len(json.dumps(line)) for line in lines if line["status"] == 200]
    assert 400 < max(sizes) < 800  # docs/operators.md: about 550 bytes per line
