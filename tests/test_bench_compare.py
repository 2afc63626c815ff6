"""`bench compare` on saved results: targets side by side per concurrency level, each with its
ratio to the first column or to a named baseline, as the seed write-up lays out its table."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from specroute.bench import SweepSettings, parse_target, render_comparison
from specroute.bench.levels import LevelSummary
from specroute.bench.probes import ServerFacts
from specroute.bench.selfcheck import ClientHealth
from specroute.bench.sweep import LevelResult, SweepResult, TargetResult
from specroute.cli import main


def _result(tok_s: dict[str, dict[int, float]]) -> SweepResult:
    """A saved sweep: per target, its per-request tok/s at each concurrency (aggregate = C x)."""
    targets = [parse_target(f"{name}=http://127.0.0.1:9") for name in tok_s]
    levels = [
        LevelResult(
            target=name,
            concurrency=c,
            summary=LevelSummary(succeeded=1, per_request_tok_s=v, aggregate_tok_s=c * v),
            client=ClientHealth(),
        )
        for name, points in tok_s.items()
        for c, v in points.items()
    ]
    return SweepResult(
        settings=SweepSettings(targets=targets),
        targets=[TargetResult(label=t.label, url=t.url, facts=ServerFacts()) for t in targets],
        levels=levels,
    )


def _block(text: str, title: str) -> list[list[str]]:
    """The rows of one metric's plain-text grid, cells split on runs of two spaces."""
    lines = text.split(f"{title}\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [[c.strip() for c in line.split("  ") if c.strip()] for line in lines]


SEED = {
    "steps1.json": _result({"steps1": {1: 123.0, 64: 66.0}}),
    "steps3.json": _result({"steps3": {1: 234.0, 64: 120.0}}),
}


def test_results_of_different_targets_line_up_per_concurrency_with_ratios() -> None:
    text = render_comparison(list(SEED.items()))
    assert text.startswith("Ratios (xN) against steps1.")
    assert _block(text, "per-request tok/s") == [
        ["level", "steps1", "steps3"],
        ["-----", "------", "-------------"],
        ["C=1", "123.0", "234.0 (x1.90)"],
        ["C=64", "66.0", "120.0 (x1.82)"],
    ]
    assert _block(text, "aggregate tok/s")[3] == ["C=64", "4,224.0", "7,680.0 (x1.82)"]


def test_a_named_baseline_takes_the_ratios() -> None:
    text = render_comparison(list(SEED.items()), baseline="steps3", markdown=True)
    assert "| C=1 | 123.0 (x0.53) | 234.0 |" in text
    with pytest.raises(ValueError, match="steps1, steps3"):
        render_comparison(list(SEED.items()), baseline="steps2")


def test_levels_sort_by_concurrency_across_results_and_gaps_show_a_dash() -> None:
    results = [
        ("a.json", _result({"k1": {16: 50.0, 1: 100.0}})),
        ("b.json", _result({"k2": {1: 150.0, 4: 120.0, 16: 60.0}})),
    ]
    rows = _block(render_comparison(results), "per-request tok/s")[2:]
    assert [r[0] for r in rows] == ["C=1", "C=4", "C=16"]
    assert rows[1] == ["C=4", "-", "120.0"]


def test_one_result_with_several_targets_gives_a_column_each() -> None:
    both = _result({"steps1": {1: 100.0}, "steps2": {1: 150.0}, "steps3": {1: 200.0}})
    rows = _block(render_comparison([("run.json", both)]), "per-request tok/s")
    assert rows[0] == ["level", "steps1", "steps2", "steps3"]
    assert rows[2] == ["C=1", "100.0", "150.0 (x1.50)", "200.0 (x2.00)"]


def test_the_same_target_in_two_results_is_named_by_file() -> None:
    before, after = _result({"pool": {1: 100.0}}), _result({"pool": {1: 110.0}})
    rows = _block(
        render_comparison([("before.json", before), ("after.json", after)]), "TTFT p50 ms"
    )
    assert rows[0] == ["level", "before", "after"]
    pair = _result({"pool": {1: 100.0}, "direct": {1: 90.0}})
    header = _block(render_comparison([("x.json", pair), ("y.json", pair)]), "TTFT p50 ms")[0]
    assert header == ["level", "x:pool", "x:direct", "y:pool", "y:direct"]


def test_compare_command_takes_a_baseline_and_refuses_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for name, result in SEED.items():
        (tmp_path / name).write_bytes(msgspec.json.encode(result))
        paths.append(str(tmp_path / name))
    assert main(["bench", "compare", *paths, "--baseline", "steps3"]) == 0
    assert "123.0 (x0.53)" in capsys.readouterr().out
    assert main(["bench", "compare", *paths, "--baseline", "nope"]) == 2
    assert "'nope' is none of the columns: steps1, steps3" in capsys.readouterr().err
