"""Defaults are what is evaluated: with a tune prior, `launch` lets the planner use the depths
the prior measured and starts the pool it recommends (tune's own rule), unless the operator
names them; without one, the built-in defaults. `--dry-run` says where each came from."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from specroute.cli import main
from specroute.launch.argv import PlanError
from specroute.launch.defaults import launch_depths, measured_depths
from specroute.profile_format import Point, Profile, Target, Traffic, encode_profile
from specroute.recommend import advise
from specroute.tune.render import render
from specroute.tune.report import TuneReport

# Aggregate tok/s per concurrency of one server, sampled traffic: k3 wins alone, k1 under
# load, k2 is never best and k0 (no speculation) never either: the pool to run is a mix of
# k1 and k3. Greedy traffic would pick otherwise (the primary kind is sampled, as in tune).
SAMPLED = {
    0: {1: 60.0, 4: 240.0, 16: 900.0, 64: 1500.0},
    1: {1: 100.0, 4: 390.0, 16: 1400.0, 64: 2400.0},
    2: {1: 140.0, 4: 500.0, 16: 1200.0, 64: 1600.0},
    3: {1: 200.0, 4: 700.0, 16: 1100.0, 64: 1150.0},
}
GREEDY_BONUS = {0: 1.0, 1: 1.0, 2: 3.0, 3: 1.0}


def _traffic(name: str, greedy: bool) -> Traffic:
    return Traffic(name=name, temperature=0.0 if greedy else 1.0, greedy=greedy,
                   ignore_eos=True, max_tokens=256, prompts="builtin")  # fmt: skip


def _prior(depths: tuple[int, ...] = (0, 1, 2, 3)) -> Profile:
    targets = [
        # As tune writes them: the server without speculation has no algorithm and no steps.
        Target(label=f"steps{k}", steps=k or None, algorithm="EAGLE" if k else None,
               max_running_requests=48, points=[
            *(Point(traffic="sampled", concurrency=c, aggregate_tok_s=v,
                    per_request_tok_s=v / c, requests=c) for c, v in SAMPLED[k].items()),
            *(Point(traffic="greedy", concurrency=c, aggregate_tok_s=v * GREEDY_BONUS[k],
                    per_request_tok_s=v * GREEDY_BONUS[k] / c, requests=c)
              for c, v in SAMPLED[k].items()),
        ])
        for k in depths
    ]  # fmt: skip
    adaptive = Target(label="adaptive", steps=3, adaptive=True, points=targets[-1].points)
    return Profile(traffic=[_traffic("greedy", True), _traffic("sampled", False)],
                   targets=[*targets, adaptive])  # fmt: skip


def test_the_prior_sets_the_allowed_depths_and_the_pool() -> None:
    depths = launch_depths(steps=None, allowed=None, prior=_prior(), prior_name="p.json")
    assert depths.allowed == (0, 1, 2, 3)
    assert depths.allowed_from == "the depths p.json measured"
    assert depths.steps == (1, 1, 3)
    assert depths.steps_from.startswith(
        "the pool p.json recommends for sampled traffic with 3 servers (+6.3% over 3 x k3;"
    )


def test_the_pool_is_the_one_tune_recommends_for_the_same_depths_and_size() -> None:
    prior = _prior()
    labels = ["steps0", "steps1", "steps2", "steps3"]
    for servers in (1, 2, 4):
        advice = advise(prior, "sampled", labels, (), servers)
        assert advice is not None
        assert advice.mix is not None
        tuned = tuple(sorted(int(label.removeprefix("steps")) for label in advice.mix.servers))
        got = launch_depths(steps=None, allowed=None, prior=prior, servers=servers)
        assert got.steps == tuned


def test_the_expected_load_picks_the_pool_best_at_that_load() -> None:
    prior = _prior()
    quiet = launch_depths(steps=None, allowed=None, prior=prior, servers=2, users=2)
    busy = launch_depths(steps=None, allowed=None, prior=prior, servers=2, users=64)
    assert quiet.steps == (3, 3)  # deep speculation wins with few users
    assert busy.steps == (1, 1)  # shallow wins under load
    assert busy.steps_from.endswith("(no mix beats 2 x k1 by 1%; for 64 requests at once)")


def test_the_measured_depths_are_the_fixed_ones_with_points() -> None:
    prior = _prior((1, 3))
    unmeasured = Target(label="steps5", steps=5)  # its sweep failed: nothing to go on
    prior = Profile(traffic=prior.traffic, targets=[*prior.targets, unmeasured])
    assert measured_depths(prior) == (1, 3)  # nor is the adaptive server a depth


def test_the_operators_flags_win_over_the_prior() -> None:
    prior = _prior()
    given = launch_depths(steps=(1, 3), allowed=(1, 2, 3), prior=prior, prior_name="p.json")
    assert (given.steps, given.steps_from) == ((1, 3), "given")
    assert (given.allowed, given.allowed_from) == ((1, 2, 3), "given")
    # Only --allowed-steps given: the prior's pool is chosen among those depths.
    narrowed = launch_depths(steps=None, allowed=(0, 2), prior=prior, servers=2)
    assert narrowed.steps == (2, 2)
    assert narrowed.allowed_from == "given"


def test_without_a_prior_the_defaults_hold_and_steps_are_needed() -> None:
    plain = launch_depths(steps=(1, 2), allowed=None, prior=None)
    assert (plain.allowed, plain.allowed_from) == ((0, 1, 2, 3), "the default")
    with pytest.raises(PlanError, match="--steps"):
        launch_depths(steps=None, allowed=None, prior=None)
    with pytest.raises(PlanError, match="no fixed depth among --allowed-steps 6,7"):
        launch_depths(steps=None, allowed=(6, 7), prior=_prior())


def test_the_pool_for_every_load_names_the_loads_another_pool_serves_better() -> None:
    """The pool chosen over every load the tune measured says at which of them another pool
    gains 5% or more, and which: the operator whose load stays there names it with
    --expected-users, and gets that pool."""
    depths = launch_depths(steps=None, allowed=None, prior=_prior(), prior_name="p.json")
    assert depths.steps == (1, 1, 3)
    named = depths.steps_from.split("geometric mean over 3-192 users; ")[1]
    assert named.endswith(": --expected-users N chooses for N at once)")
    claims = [c.split(" ") for c in named.split(":")[0].split(", ")]
    assert claims, depths.steps_from
    for pool, gain, _, users, _ in claims:
        assert float(gain.rstrip("%")) >= 5.0
        chosen = launch_depths(steps=None, allowed=None, prior=_prior(), users=int(users))
        assert ",".join(map(str, chosen.steps)) == pool
    # One depth measured: one pool at every load, nothing to name.
    alone = launch_depths(steps=None, allowed=None, prior=_prior((1,)), prior_name="p.json")
    assert alone.steps_from.endswith("geometric mean over 3-192 users)")


def test_a_pool_better_by_less_than_5_percent_at_one_load_is_not_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three k0 servers 3% over three k3 at 64 users each, behind them at every other load.
    monkeypatch.setitem(SAMPLED[0], 64, SAMPLED[3][64] * 1.03)
    depths = launch_depths(steps=None, allowed=None, prior=_prior((0, 3)), prior_name="p.json")
    assert depths.steps == (3, 3, 3)
    busy = launch_depths(steps=None, allowed=None, prior=_prior((0, 3)), users=192)
    assert busy.steps == (0, 0, 0)
    assert depths.steps_from.endswith("geometric mean over 3-192 users)")


def test_the_traffic_named_chooses_the_pool_for_it() -> None:
    # Greedy traffic triples k2's tok/s in this prior: the operator whose requests are greedy
    # (coding agents at temperature 0) names it and gets k2 servers where sampled gets k1/k3.
    sampled = launch_depths(steps=None, allowed=None, prior=_prior(), prior_name="p.json")
    greedy = launch_depths(steps=None, allowed=None, prior=_prior(), prior_name="p.json",
                           traffic="greedy")  # fmt: skip
    assert sampled.steps == (1, 1, 3)
    assert greedy.steps == (2, 2, 2)
    assert greedy.steps_from.startswith("the pool p.json recommends for greedy traffic")
    named = launch_depths(steps=None, allowed=None, prior=_prior(), traffic="sampled")
    assert named.steps == sampled.steps
    with pytest.raises(PlanError, match=r"--expected-traffic chat: p\.json measured greedy "
                       r"and sampled traffic"):  # fmt: skip
        launch_depths(steps=None, allowed=None, prior=_prior(), prior_name="p.json",
                      traffic="chat")  # fmt: skip


def _dry_run(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    status = main(["launch", "--emulate", "--dry-run", *flags])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_dry_run_starts_the_priors_pool_and_says_where_each_came_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prior = tmp_path / "prior.json"
    prior.write_bytes(encode_profile(_prior((0, 1, 2, 3))))
    status, out, err = _dry_run(capsys, "--prior", str(prior), "--servers", "2")
    assert status == 0, err
    assert f"# --allowed-steps 0,1,2,3: the depths {prior} measured\n" in out
    assert f"# --steps 1,3: the pool {prior} recommends for sampled traffic with 2 servers" in out
    status, greedy, err = _dry_run(capsys, "--prior", str(prior), "--servers", "2",
                                   "--expected-traffic", "greedy")  # fmt: skip
    assert status == 0, err
    assert f"# --steps 2,2: the pool {prior} recommends for greedy traffic with 2 servers" in greedy
    status, _, err = _dry_run(capsys, "--prior", str(prior), "--expected-traffic", "chat")
    assert status == 2
    assert f"--expected-traffic chat: {prior} measured greedy and sampled traffic" in err
    started = [line.split(" --steps ")[1].split()[0]
               for line in out.splitlines() if "specroute emulate" in line]  # fmt: skip
    assert started == ["1", "3"]


def test_dry_run_names_given_and_default_sources(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _dry_run(capsys, "--steps", "1,3")
    assert status == 0
    assert "# --steps 1,3: given\n" in out
    assert "# --allowed-steps 0,1,2,3: the default\n" in out
    status, _, err = _dry_run(capsys)
    assert status == 2
    assert "--steps K,K,... is required (or --prior FILE" in err
    for flag, value in (("--servers", "2"), ("--expected-users", "2"),
                        ("--expected-traffic", "greedy")):  # fmt: skip
        status, _, err = _dry_run(capsys, "--steps", "1", flag, value)
        assert status == 2
        assert f"{flag} is for the pool --prior recommends; --steps names every server" in err


def test_lanes_on_the_priors_pool_of_one_depth_get_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The prior's pool for 3 users at once is three k3 servers: chosen for throughput, with no
    # deeper server for an interactive lane. With a lane target the launch says so and how to
    # serve the lane from the start; a mixed pool, named steps or no target, no note.
    prior = tmp_path / "prior.json"
    prior.write_bytes(encode_profile(_prior()))
    lanes = tmp_path / "lanes.toml"
    lanes.write_text("[lanes]\ntarget_tok_s = 100.0\n")
    plain = tmp_path / "plain.toml"
    plain.write_text("[lanes]\nreserve = 4\n")
    note = "note: [lanes] sets the interactive lane a target, and the pool the prior recommends"
    status, out, err = _dry_run(
        capsys, "--prior", str(prior), "--expected-users", "3", "--config", str(lanes)
    )
    assert status == 0, err
    assert "# --steps 3,3,3: the pool" in out
    assert f"specroute launch: {note} (3,3,3) is chosen for throughput" in err
    assert "--steps naming a mixed pool, one server deeper, serves the lane" in err
    for flags in (
        ("--prior", str(prior), "--config", str(lanes)),  # its pool over every load: 1,1,3
        ("--prior", str(prior), "--expected-users", "3", "--config", str(plain)),
        ("--steps", "3,3,3", "--config", str(lanes)),
    ):
        status, _, err = _dry_run(capsys, *flags)
        assert status == 0, err
        assert note not in err


def test_loop_flags_with_the_loop_off_get_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    # With --reconfigure off no planner runs: a planner setting or dwell given then is said to
    # do nothing, where before it was taken in silence.
    status, _, err = _dry_run(
        capsys, "--steps", "1,2", "--reconfigure", "off", "--planner-option", "settle_s=5",
        "--min-dwell", "60",
    )  # fmt: skip
    assert status == 0, err
    assert "note: --planner-option settle_s=5 has no effect with --reconfigure off" in err
    assert "note: --min-dwell has no effect with --reconfigure off" in err
    status, _, err = _dry_run(
        capsys, "--steps", "1,2", "--reconfigure", "advise", "--planner-option", "settle_s=5"
    )
    assert status == 0, err
    assert "has no effect" not in err


def test_a_launch_on_port_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # An ephemeral port is one the launcher's depth loop and its printout could not name.
    status, _, err = _dry_run(capsys, "--steps", "1,2", "--port", "0")
    assert status == 2
    assert "--port must be a port from 1 to 65535, not 0" in err


def test_the_tune_report_names_the_pool_launch_starts_for_the_other_traffic() -> None:
    # The tune's report starts the sampled pool (1,1,3 here); for greedy requests it says
    # which flag starts the greedy pool, and that is what `launch` starts with that flag.
    prior = _prior()
    labels = [f"steps{k}" for k in (0, 1, 2, 3)]
    advice = [a for kind in ("greedy", "sampled") if (a := advise(prior, kind, labels, (), 3))]
    report = TuneReport(model="m", emulated=True, profile=None, time_scale=1.0,
                        traffic=prior.traffic, concurrency=[], servers=3, depths=[], failures={},
                        advice=advice, recommended_for="sampled",
                        command="specroute launch --steps 1,1,3", seed=None,
                        prior="p.json")  # fmt: skip
    text = render(report, prior)
    line = (
        "Mostly greedy requests? `specroute launch --prior p.json --expected-traffic greedy` "
        "(no --steps) starts 2,2,2, the pool for greedy traffic."
    )
    assert line in text
    assert "Mostly sampled requests?" not in text
    started = launch_depths(steps=None, allowed=None, prior=prior, traffic="greedy")
    assert started.steps == (2, 2, 2)
    # Where both kinds want the same pool there is nothing to add.
    same = msgspec.structs.replace(report, advice=[advice[1]])
    assert "Mostly" not in render(same, prior)
