"""aiohttp is the bench's optional extra: everything else imports without it, and the bench
says how to install it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specroute.bench.client import BenchClient

_WITHOUT_AIOHTTP = "import sys; sys.modules['aiohttp'] = None; "


def test_the_command_line_and_the_proxy_import_without_aiohttp() -> None:
    code = _WITHOUT_AIOHTTP + "import specroute.cli, specroute.proxy, specroute.bench"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_bench_client_without_aiohttp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'specroute\[bench\]'"):
        BenchClient(connections=1)
