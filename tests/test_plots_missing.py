"""Without matplotlib, the commands that draw PNGs say which extra to install before any work and
never claim a file they did not write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_run, refused_url

from specroute.cli import main

HINT = "pip install 'specroute[plot]'"
NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; "  # any import of it fails


@pytest.mark.parametrize("command", ["sweep", "trace"])
def test_bench_plots_without_matplotlib_exit_2_naming_the_extra_before_sending(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with refused_url() as target:  # nothing answers: any work would show up as errors
        args = [target] if command == "sweep" else ["scenarios/policy-eval.toml", target]
        status = main(["bench", command, *args, "--plots", str(tmp_path / "plots")])
    out, err = capsys.readouterr()
    assert status == 2
    assert HINT in err
    assert out == ""
    assert not (tmp_path / "plots").exists()


@pytest.mark.timeout(120)
def test_tune_without_matplotlib_says_so_first_and_does_not_claim_tune_png(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    argv = ["tune", "--emulate", "--steps", "1", "--concurrency", "1", "--temperature", "0",
            "--max-tokens", "8", "--prompt-words", "8", "--warmup", "1", "--time-scale", "10",
            "--base-port", str(free_run(1)), "--out", str(out)]  # fmt: skip
    code = NO_MATPLOTLIB + f"from specroute.cli import main; sys.exit(main({argv!r}))"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=110, check=False
    )
    text = run.stderr + run.stdout
    assert run.returncode == 0, text
    assert HINT in run.stderr
    assert run.stderr.index(HINT) < run.stderr.index("steps1: started")
    assert (out / "prior.json").exists()
    assert not (out / "tune.png").exists()
    wrote = next(line for line in run.stdout.splitlines() if line.startswith("Wrote "))
    assert "tune.png" not in wrote
    assert f"No tune.png: PNG plots need matplotlib: {HINT}." in run.stdout
