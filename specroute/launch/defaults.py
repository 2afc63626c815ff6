"""Where `launch`'s depths come from, so that what runs by default is what was evaluated: the
depths the planner may use are the operator's `--allowed-steps`, else the depths the tune
prior measured, else the built-in default; the pool started is the operator's `--steps`, else
the pool the prior recommends (`specroute tune`'s own rule). With vLLM and `--allow-adaptive`,
a server the prior recommends at a depth starts with the K-per-batch table the planner writes
from the prior (`planner.tables`, for the traffic the pool is chosen for) where that table
drafts the depth alone and less when crowded: at every batch size it runs the K up to its depth
with the most tok/s, in the same memory. Pure: the caller reads the file."""

from __future__ import annotations

import msgspec

from specroute.launch.argv import PlanError
from specroute.planner import DepthEstimate, Estimates, Table
from specroute.planner.forecast import Physics
from specroute.planner.tables import table_settings
from specroute.policies import ClassEstimate
from specroute.profile_format import Profile, Target, depth_curves
from specroute.recommend import (
    MIN_MIX_GAIN,
    MIN_STEP_GAIN,
    Advice,
    MixAdvice,
    advise,
    best_mix,
    curves,
    pool_values,
    primary,
)
from specroute.reconfigure.loop import ReconfigureOptions

__all__ = ["LaunchDepths", "launch_depths", "measured_depths"]


class LaunchDepths(msgspec.Struct, frozen=True, kw_only=True):
    """The servers' depths and the planner's, each with where it came from (`--dry-run`
    prints these, the launch logs them)."""

    steps: tuple[int, ...]
    """One server per entry."""
    steps_from: str
    allowed: tuple[int, ...]
    allowed_from: str
    tables: dict[int, Table] = {}
    """vLLM's K per batch size the servers launched at a depth (its `num_speculative_tokens`)
    start with."""

    def notes(self) -> list[str]:
        """`--steps 1,2,2: ...` and `--allowed-steps ...: ...`, one line each, and a line
        per K-per-batch table started."""
        return [
            f"--steps {_text(self.steps)}: {self.steps_from}",
            f"--allowed-steps {_text(self.allowed)}: {self.allowed_from}",
            *(
                f"--allow-adaptive: the servers at {d} start with K per batch size "
                f"{table_text(t)} (num_speculative_tokens {d}), the table the prior gives"
                for d, t in self.tables.items()
            ),
        ]


def _text(steps: tuple[int, ...]) -> str:
    return ",".join(map(str, steps))


def table_text(table: Table) -> str:
    """`1-8:3 9-:2`: each range's batch sizes and K."""
    out = []
    for i, (first, k) in enumerate(table):
        last = table[i + 1][0] - 1 if i + 1 < len(table) else None
        span = f"{first}-" if last is None else str(first) if last == first else f"{first}-{last}"
        out.append(f"{span}:{k}")
    return " ".join(out)


def _depth(target: Target) -> int | None:
    """A measured server's depth: one without a speculative algorithm runs at 0 (as the
    pool reads /server_info), whatever its `steps` says."""
    return 0 if target.algorithm is None and not target.steps else target.steps


def _fixed(profile: Profile) -> dict[str, int]:
    """The prior's fixed-depth servers with measurements, by label, shallow first."""
    found = [(d, t.label) for t in profile.targets
             if not t.adaptive and t.points and (d := _depth(t)) is not None]  # fmt: skip
    return {label: depth for depth, label in sorted(found)}


def measured_depths(profile: Profile) -> tuple[int, ...]:
    """The depths the prior measured a fixed-depth server at."""
    return tuple(sorted(set(_fixed(profile).values())))


def measured_traffic(profile: Profile) -> list[str]:
    """The traffic kinds the prior measured, in its order (tune's `greedy`, `sampled`)."""
    return [t.name for t in profile.traffic] or sorted(
        {p.traffic for t in profile.targets for p in t.points}
    )


def _primary(
    profile: Profile, labels: list[str], servers: int, traffic: str | None = None
) -> Advice | None:
    """Tune's recommendation for the traffic kind a pool is chosen for: `traffic` where the
    operator names it (`--expected-traffic`), else tune's own choice (sampled: SGLang samples
    unless asked not to)."""
    kinds = [traffic] if traffic is not None else measured_traffic(profile)
    return primary([a for kind in kinds if (a := advise(profile, kind, labels, (), servers))])


def _recommended(
    profile: Profile,
    allowed: tuple[int, ...],
    servers: int,
    name: str,
    users: int | None,
    traffic: str | None = None,
) -> tuple[tuple[int, ...], str]:
    """The prior's pool of `servers` among `allowed` (for `users` at once, else over every
    load it measured; for `traffic`, else tune's kind), with why; PlanError when there is
    none."""
    if traffic is not None and traffic not in (kinds := measured_traffic(profile)):
        raise PlanError(
            f"--expected-traffic {traffic}: {name} measured "
            + (" and ".join(kinds) if kinds else "no traffic")
            + " traffic"
        )
    steps_of = {label: k for label, k in _fixed(profile).items() if k in allowed}
    chosen = _primary(profile, list(steps_of), servers, traffic)
    mix = chosen.mix if chosen is not None else None
    if chosen is not None and users is not None:
        table = curves(profile, chosen.traffic)
        mix = best_mix(table, servers, list(steps_of), (), loads=(users,))
    if chosen is None or mix is None:
        raise PlanError(
            f"--prior {name} measured no fixed depth among --allowed-steps {_text(allowed)}: "
            "name the servers with --steps"
        )
    baseline = f"{servers} x k{steps_of[mix.baseline[0]]}"
    against = (
        f"no mix beats {baseline} by {MIN_MIX_GAIN:.0%}"
        if mix.servers == mix.baseline
        else f"{mix.gain:+.1%} over {baseline}"
    )
    loads = sorted(mix.by_load)
    at = (
        f"for {users} requests at once"
        if users
        else f"geometric mean over {loads[0]}-{loads[-1]} users"
        + _elsewhere(curves(profile, chosen.traffic), mix, list(steps_of), steps_of)
    )
    why = (
        f"the pool {name} recommends for {chosen.traffic} traffic with {servers} servers "
        f"({against}; {at})"
    )
    return tuple(sorted(steps_of[label] for label in mix.servers)), why


def _elsewhere(
    table: dict[str, dict[int, float]], mix: MixAdvice, labels: list[str], steps_of: dict[str, int]
) -> str:
    """Where the pool chosen over every load is not the one for a load the operator expects:
    each load it was judged at where another pool gains `MIN_STEP_GAIN` or more over it, with
    that pool, and the flag that chooses for one load ("" where there is none)."""
    servers = len(mix.servers)
    found = []
    for load in sorted(mix.by_load):
        there = best_mix(table, servers, labels, (), loads=(load,))
        if there is None or sorted(there.servers) == sorted(mix.servers):
            continue
        ours = pool_values(table, mix.servers, (load,))[load]
        gain = pool_values(table, there.servers, (load,))[load] / ours - 1 if ours > 0 else 0.0
        if gain >= MIN_STEP_GAIN:
            pool = ",".join(str(k) for k in sorted(steps_of[label] for label in there.servers))
            found.append(f"{pool} {gain:+.1%} at {load} users")
    if not found:
        return ""
    return f"; {', '.join(found)}: --expected-users N chooses for N at once"


def _tables(
    profile: Profile, steps: tuple[int, ...], servers: int, traffic: str | None = None
) -> dict[int, Table]:
    """The K-per-batch table the planner writes from the prior for each depth in `steps`, for
    the traffic a pool is chosen for, where it drafts that depth alone and less when crowded."""
    chosen = _primary(profile, list(_fixed(profile)), servers, traffic)
    fit = profile.acceptance.get("greedy" if chosen and chosen.traffic == "greedy" else "sampled")
    if fit is None:
        return {}
    measured = depth_curves(profile.targets)
    depths = {}
    for d in profile.depths:
        if d.max_running_requests:
            depths[d.steps] = DepthEstimate(
                steps=d.steps, capacity=d.max_running_requests, intercept_s=d.intercept_s,
                per_token_s=d.per_token_s, measured=measured.get(d.steps, ()),
            )  # fmt: skip
    klass = ClassEstimate(alpha=fit.alpha, accept_length=dict(fit.accept_length))
    phys = Physics(Estimates(depths=depths, classes={"prior": klass}))
    # Only a table that still drafts the depth alone: one that never does would keep the
    # depth's memory (fewer slots) for nothing, and lose the mix its depth was chosen for.
    settings = table_settings(phys, {"prior": 1.0}, sorted(set(steps)))
    return {s.steps: s.table for s in settings if s.table[0][1] == s.steps}


def launch_depths(
    *,
    steps: tuple[int, ...] | None,
    allowed: tuple[int, ...] | None,
    prior: Profile | None,
    prior_name: str = "the prior",
    servers: int = 3,
    users: int | None = None,
    tables: bool = False,
    traffic: str | None = None,
) -> LaunchDepths:
    """The depths `launch` starts and lets the planner use: the operator's where named (None
    where not), else the prior's (its pool of `servers` for `users` at once, else over the
    loads it measured; for the `traffic` kind named, else tune's; each server with its
    K-per-batch table where `tables`: vLLM with `--allow-adaptive`), else the defaults.
    PlanError when no pool can be chosen."""
    measured = measured_depths(prior) if prior is not None else ()
    if allowed is not None:
        allowed_from = "given"
    elif measured:
        allowed, allowed_from = measured, f"the depths {prior_name} measured"
    else:
        allowed = ReconfigureOptions().allowed_steps
        allowed_from = "the default" + (f" ({prior_name} measured no depth)" if prior else "")
    if steps is not None:
        return LaunchDepths(steps=steps, steps_from="given", allowed=allowed,
                            allowed_from=allowed_from)  # fmt: skip
    if prior is None:
        raise PlanError("--steps K,K,... is required (or --prior FILE: the pool it recommends)")
    chosen, why = _recommended(prior, allowed, servers, prior_name, users, traffic)
    written = _tables(prior, chosen, servers, traffic) if tables else {}
    return LaunchDepths(steps=chosen, steps_from=why, allowed=allowed, allowed_from=allowed_from,
                        tables=written)  # fmt: skip
