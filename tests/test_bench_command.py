"""The `specroute bench` command line: sweep writes its outputs, compare and profile read them
back, Poisson and multi-process load work, bad input exits 2."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest
from servers import start_emulator

from specroute.bench import (
    ApiSettings,
    PromptSettings,
    Sampling,
    SweepSettings,
    parse_target,
    run_sweep,
)
from specroute.bench.loadgen import poisson_arrivals
from specroute.cli import main


def test_sweep_command_writes_json_csv_markdown_plots_then_compare_and_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    with start_emulator(2, "--seed", "4", "--time-scale", "10") as server:
        status = main(
            [
                "bench",
                "sweep",
                f"steps2={server.url}",
                "-c",
                "1,2",
                "--max-tokens",
                "16",
                "--prompt-words",
                "8",
                "--json",
                str(out),
                "--csv",
                str(tmp_path / "run.csv"),
                "--markdown",
                str(tmp_path / "run.md"),
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
    assert status == 0
    table = capsys.readouterr().out
    assert "Per-request tok/s" in table
    assert "steps2" in table
    assert (tmp_path / "plots" / "throughput.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "latency.png").exists()
    assert "steps2" in (tmp_path / "run.csv").read_text()
    assert main(["bench", "compare", str(out), str(out)]) == 0
    assert "(x1.00)" in capsys.readouterr().out
    profile = tmp_path / "profile.json"
    assert main(["bench", "profile", str(out), "-o", str(profile)]) == 0
    data = json.loads(profile.read_text())
    assert data["schema"] == "specroute.profile/2"
    assert data["targets"][0]["steps"] == 2
    assert [p["concurrency"] for p in data["targets"][0]["points"]] == [1, 2]


def test_sweep_with_a_bad_extra_body_exits_two() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "sweep", "http://127.0.0.1:9", "--extra-body", "[1]"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("flags", "said"),
    [(("--duration", "-1"), "duration must be > 0 seconds"),
     (("--warmup", "-1"), "warmup must be >= 0"),
     (("--min-requests", "0", "--requests-per-concurrency", "0"), "would send no request"),
     (("--max-concurrency", "0"), "max_concurrency must be >= 1"),
     (("--timeout", "0"), "timeout must be > 0 seconds"),
     (("--top-p", "0"), "top_p must be in (0, 1], not 0"),
     (("--temperature", "-1"), "temperature must be >= 0, not -1")],
)  # fmt: skip
def test_a_sweep_setting_out_of_range_is_refused_before_a_request_is_sent(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], said: str
) -> None:
    # Taken before: --top-p 0 or --timeout 0 ran every level to errors, --duration -1 ended
    # with "no request succeeded". Port 9 (discard) is never reached.
    assert main(["bench", "sweep", "http://127.0.0.1:9", *flags]) == 2
    assert said in capsys.readouterr().err


def test_poisson_arrivals_are_reproducible_and_average_the_rate() -> None:
    times = poisson_arrivals(50.0, start=0.0, count=2000, duration=None, seed=1)
    assert times == poisson_arrivals(50.0, start=0.0, count=2000, duration=None, seed=1)
    assert 45 < len(times) / times[-1] < 55
    assert all(b > a for a, b in itertools.pairwise(times))


def test_open_loop_and_worker_processes_complete_every_request() -> None:
    with start_emulator(3, "--seed", "6", "--time-scale", "10") as server:
        base = {
            "targets": [parse_target(server.url)],
            "prompts": PromptSettings(words=8),
            "mix": [Sampling(max_tokens=16)],
            "warmup": 0,
        }
        poisson = asyncio.run(run_sweep(SweepSettings(rates=[40.0], requests=12, **base)))
        spread = asyncio.run(
            run_sweep(SweepSettings(concurrency=[4], requests=8, workers=2, **base))
        )
    assert poisson.levels[0].rate == 40.0
    assert poisson.levels[0].summary.succeeded == 12
    level = spread.levels[0]
    assert level.summary.succeeded == 8
    assert level.client.workers == 2
    assert len({r.index for r in level.records}) == 8


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_bench_drives_agent_traffic_and_counts_its_tokens(api: str) -> None:
    with start_emulator(3, "--seed", "6", "--time-scale", "10") as server:
        settings = SweepSettings(
            targets=[parse_target(server.url)],
            prompts=PromptSettings(words=8),
            mix=[Sampling(max_tokens=24)],
            concurrency=[2],
            requests=4,
            warmup=0,
            api=ApiSettings(api=api),  # type: ignore[arg-type]
        )
        result = asyncio.run(run_sweep(settings))
    level = result.levels[0]
    assert level.summary.succeeded == 4
    for record in level.records:
        assert record.error is None
        assert record.completion_tokens == 24  # from the usage at the stream's end
        assert record.token_source == "final"
        assert record.prompt_tokens > 8
        assert 1 < len(record.chunk_times) <= 24  # one text delta per engine iteration
        assert record.first_token is not None
