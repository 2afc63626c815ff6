"""`bench trace`: the shipped scenario loads, and a short scenario replays phase by phase with
greedy and sampled traffic reported separately."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from servers import start_emulator

from specroute.bench import load_scenario, render_table, run_trace
from specroute.bench.trace import Scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

SHORT = """
name = "short"
[prompts]
words = 16
[[mix]]
name = "greedy"
temperature = 0.0
max_tokens = 24
ignore_eos = true
[[mix]]
name = "sampled"
temperature = 0.9
max_tokens = 24
ignore_eos = true
[[phases]]
name = "one"
concurrency = 1
duration = 0.4
[[phases]]
name = "eight"
concurrency = 8
duration = 0.4
"""


def test_shipped_policy_scenario_ramps_one_to_sixty_four_and_back() -> None:
    scenario = load_scenario(SCENARIOS / "policy-eval.toml")
    assert [p.concurrency for p in scenario.phases] == [1, 8, 32, 64, 16, 1]
    assert {s.name for s in scenario.mix} == {"greedy", "sampled"}
    assert all(p.duration >= 30 for p in scenario.phases)


def test_scenario_with_a_bad_phase_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[[phases]]\nname = "x"\nduration = "long"\n')
    with pytest.raises(msgspec.ValidationError, match=r"bad\.toml: .*phases\[0\]\.duration"):
        load_scenario(path)


def test_a_scenario_that_is_not_toml_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("phases = [\n")
    with pytest.raises(ValueError, match=r"scenario .*broken\.toml: not valid TOML"):
        load_scenario(path)


def test_trace_reports_every_phase_with_greedy_accepting_more(tmp_path: Path) -> None:
    path = tmp_path / "short.toml"
    path.write_text(SHORT)
    scenario: Scenario = load_scenario(path)
    with start_emulator(3, "--seed", "3", "--time-scale", "10") as server:
        result = asyncio.run(run_trace(scenario, server.url))
    assert [lv.phase for lv in result.levels] == ["one", "eight"]
    busy = result.levels[1].summary
    assert busy.succeeded >= 8
    assert busy.errors == 0
    greedy, sampled = busy.classes["greedy"].accept.sglext, busy.classes["sampled"].accept.sglext
    assert greedy is not None
    assert sampled is not None
    assert greedy > sampled
    indices = [r.index for lv in result.levels for r in lv.records]
    assert len(indices) == len(set(indices))
    table = render_table(result)
    assert "eight" in table
    assert "greedy" in table


def test_a_misspelt_key_in_a_scenario_names_the_field_meant(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('name = "t"\n[[phases]]\nname = "a"\nconcurency = 1\nduration = 5\n')
    with pytest.raises(
        msgspec.ValidationError, match=r"\$\.phases\[0\]`; did you mean concurrency\?"
    ):
        load_scenario(path)
    path.write_text('name = "t"\nzzqq = 1\n')
    with pytest.raises(
        msgspec.ValidationError, match=r"the fields there: name, description, prompts"
    ):
        load_scenario(path)
