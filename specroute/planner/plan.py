"""The depth planner: which depth each server should run for the load regime, and whether
restarting one pays. A pure state machine like the circuit breaker: the caller passes `now`,
the pool's servers and the estimators; the plan says what to restart and why, in numbers."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence

import msgspec

from specroute.planner.decision import Change, Plan, PlannerOptions, ServerState
from specroute.planner.estimates import Estimates
from specroute.planner.forecast import (
    Forecast,
    Physics,
    Setting,
    forecast_seen,
    user_split,
)
from specroute.planner.lanes import LaneDemand, lane_reason, served_first
from specroute.planner.regime import Past, Regime, RegimeTracker
from specroute.planner.search import candidates
from specroute.planner.tables import table_settings

__all__ = ["Planner"]

_ERRORS_KEPT = 5
"""Settled forecasts whose median error widens the bar."""
SEEN_HEADROOM = 2.0
"""Once the load has moved, how far above the highest load seen every pool must stay able
to restart a server (`_escape_floor`): a ramp's next step doubles it."""
_Load = tuple[tuple[str, float], ...]
"""Users per class, sorted: one load's key."""


class _Candidate(msgspec.Struct, frozen=True, kw_only=True):
    settings: tuple[Setting, ...]
    forecast: Forecast
    """At the current regime."""
    changes: tuple[Change, ...]
    gain: float
    """Over the horizon's loads, per second."""
    gain_tokens: float
    cost: float

    def pays(self, margin: float) -> bool:
        """Its gain over the horizon is more than `margin` times its restart cost."""
        return self.gain_tokens > margin * self.cost

    def rank(self) -> tuple[float, int]:
        """Net tokens first; between equals, fewer restarts."""
        return (self.gain_tokens - self.cost, -len(self.changes))


class _Held(msgspec.Struct, frozen=True, kw_only=True):
    """The best pool the peak rule excludes (`escape_load` under the floor), for the reason."""

    settings: tuple[Setting, ...]
    gain: float
    """Over the horizon's loads, per second, as `_Candidate.gain`."""
    share: float | None
    """That gain over what the current pool yields there; None where the current pool's
    objective is not positive (an interactive lane's shortfall charged, `served_first`),
    of which no share is a measure."""
    escape: float


class Planner:
    """Learns the load's regimes from `observe` and proposes depth changes from `plan`."""

    def __init__(self, options: PlannerOptions | None = None) -> None:
        self.options = o = options or PlannerOptions()
        self.regimes = RegimeTracker(
            band=o.band,
            mix_shift=o.mix_shift,
            window_s=o.window_s,
            prior_s=o.regime_prior_s,
            prior_weight=o.regime_prior_weight,
            min_s=o.regime_min_s,
        )
        self._launched: float | None = None
        """The slots of the pool at its first plan: the peak it was sized for."""
        self._escaping: _Candidate | None = None
        """Of the pools that stay reconfigurable at the floor, the one losing least, when the
        pool now does not (`_search`, where the floor has risen past it)."""
        self._launched_escape: float | None = None
        """The highest load under which the pool at its first plan could still restart a
        server (`escape_load`): no proposal is less reconfigurable than what was launched."""
        self.regret = 0.0
        """What changes that did not pay added to the bar (`account`)."""
        self.overpromised: deque[tuple[float, Past]] = deque(maxlen=_ERRORS_KEPT)
        """How far the forecast gains of the latest changes that settled (`account`) overshot
        their realized gains beyond the noise (0 where they did not), each with the load it
        settled under."""
        self._proposal: tuple[tuple[Setting, ...], float] | None = None
        """The target last proposed and since when, for `confirm_s`."""
        self.lanes: LaneDemand | None = None
        """The interactive lane's load and target, as last read: served first (`lanes`)."""
        self._seen: tuple[tuple[Setting, ...], dict[_Load, dict[str, float]]] = ((), {})
        """The pool the loads were seen on (the pool at this plan), and each load's per-class
        speed there: a candidate's forecast holds the same mix of requests, not of users in
        flight (`held_under`)."""
        fixed = [Setting(steps=k) for k in range(o.max_steps + 1)]
        adaptive = [Setting(steps=max(k for _, ks in t for k in ks), tiers=t) for t in o.adaptive]
        self.choices = (*fixed, *adaptive)

    def observe(self, now: float, in_flight: Mapping[str, float], queued: float = 0.0) -> None:
        """One sample of the traffic: requests in flight per class, plus those queued."""
        total = sum(in_flight.values())
        scale = (total + queued) / total if total > 0 else 1.0
        self.regimes.observe(now, {c: n * scale for c, n in in_flight.items()})

    def plan(self, now: float, servers: Sequence[ServerState], est: Estimates) -> Plan:
        """The best assignment for the regime, and the restarts to begin now, if any pay."""
        o = self.options
        regime = self.regimes.view(now)
        users = user_split(regime.concurrency, regime.shares)
        phys = Physics(est)
        self._seen = (tuple(s.setting for s in servers), {})
        if self._launched is None and all(s.setting.deepest in phys.depths for s in servers):
            self._launched = sum(phys.depths[s.setting.deepest].capacity for s in servers)
            self._launched_escape = self.escape_load([s.setting for s in servers], phys)
        now_fc = self._forecast([s.setting for s in servers], users, phys)
        why = _unsettled(regime, o.settle_s, users)
        if why:
            self._proposal = None
            return Plan(at=now, verdict="hold: regime not settled", reason=why, regime=regime,
                        current=now_fc)  # fmt: skip
        horizon = self.horizon(servers, regime)
        loads = self._loads(now, horizon, users)
        escape = self._escape_floor(regime)
        self._escaping = None
        found = self._search(servers, users, phys, now_fc, regime, (horizon, loads), escape)
        best, gaining, held = found
        escaping = best is None and self._escaping is not None
        if escaping:  # the floor has risen past the pool: it leaves while it still can
            best = self._escaping
        standing = self._confirm(now, best)
        if best is not None:
            best = self._gainful_first(servers, best, loads, phys, escape)
        shown = best or gaining
        bar = self.bar
        untold = self._untold_note(loads, regime) + self._held_note(held, shown, regime)
        reach = self.escape_load([s.setting for s in servers], phys)
        if escaping:
            untold += (
                f"; the pool could restart a server only under {reach:.0f} users, and must "
                f"stay able to under {escape:.0f}: it leaves while it can"
            )
        elif reach < escape and not self._lasting(servers):
            untold += (
                f"; the pool could restart a server only under {reach:.0f} users, and must "
                f"stay able to under {escape:.0f}: it stays, as regimes last "
                f"{statistics.median(self.regimes.durations):.0f}s (their median), less than "
                f"a restart and the dwell ({self._commit(servers):.0f}s)"
            )
        if shown is None:
            why = f"no assignment gains {bar:.0%} over {horizon:.0f}s{untold}"
            return Plan(at=now, verdict="hold: nothing gains enough", regime=regime,
                        current=now_fc, horizon_s=horizon, bar=bar, reason=why)  # fmt: skip
        lane_tokens = self._lane_tokens([s.setting for s in servers], shown, loads, phys)
        reason = _numbers(now_fc, shown, regime, horizon, len(loads), lane_tokens) + untold
        reason += lane_reason(
            self.lanes, phys, users, ([s.setting for s in servers], now_fc),
            (shown.settings, shown.forecast),
        )  # fmt: skip
        start: tuple[Change, ...] = ()
        if best is None and shown.pays(o.margin) and _bets(regime, shown.forecast, now_fc):
            verdict = "hold: loses under the load now, and no regime like it has ended"
        elif best is None:
            verdict = "hold: does not pay"
        elif standing < o.confirm_s:
            verdict = f"hold: proposed {standing:.0f}s ago, confirming for {o.confirm_s:.0f}s"
        else:
            start, blocked = self._startable(now, servers, best, regime, phys)
            at = (users, phys, now_fc, regime, escape)
            if start and not escaping and self._stranded(now, servers, start, best, at):
                start, blocked = (), "the rest of the target would not pay from half-way"
            verdict = "reconfigure" if start else f"hold: {blocked}"
        expected = None
        if start:  # what the pool will run once these changes are done: held to account
            moved = {c.server: c.after for c in start}
            expected = self._forecast([moved.get(s.name, s.setting) for s in servers], users, phys)
        return Plan(
            at=now, verdict=verdict, reason=reason, regime=regime, current=now_fc,
            proposed=shown.forecast, expected=expected, gain=shown.gain,
            gain_tokens=shown.gain_tokens, restart_cost_tokens=shown.cost, horizon_s=horizon,
            bar=bar, changes=shown.changes, start=start,
        )  # fmt: skip

    @property
    def bar(self) -> float:
        """The gain a change must promise, as a fraction of the objective: `min_gain`, raised
        by `regret` while changes have not paid and by the median over-promise of the latest
        forecast gains under a load like the current one (a gain inside the band they
        overshot by is not one). A gain, not a level: a forecast that put both pools 6% high
        promised their ratio right. A gain that fell short of what its change realized says
        nothing against the next one, nor does one missed under another load: two greedy
        users' short requests are over-promised by what the forecast leaves out, their
        prefills, which a busy pool's forecast does not share."""
        alike = [e for e, load in self.overpromised if self.regimes.alike(load)]
        band = statistics.median(alike) if alike else 0.0
        return self.options.min_gain + self.regret + band

    def account(
        self, realized_gain: float, forecast_gain: float | None = None, noise: float = 0.0
    ) -> None:
        """A change's realized gain (its rate after over its rate before, less one, in the
        same regime, the current one: an account closes in the regime it began in) and the
        gain its plan forecast. One that fell short of `min_gain` by more than `noise`
        raises the bar by `min_gain` (up to `regret_cap`); one that paid lowers it by as
        much; one short by less than its noise leaves it: it says neither.

        The forecast's miss counts beyond `noise`, the realized gain's standard error: at a
        few users a rate is a few dozen replies, whose count moves by chance, and a miss of
        that size taken at face value raised the bar over the next change's gain. So does
        the shortfall: a gain read at -8.7% with a standard error of 18.9% doubled the bar
        on costly-drafts' day, as if the change had not paid."""
        o = self.options
        if forecast_gain is not None:
            beyond = max(0.0, forecast_gain - realized_gain - noise)
            self.overpromised.append((beyond, self.regimes.load))
        step = max(o.min_gain, 0.01)
        if realized_gain + noise < o.min_gain:
            self.regret = min(o.regret_cap, self.regret + step)
        elif realized_gain >= o.min_gain:
            self.regret = max(0.0, self.regret - step)

    def horizon(self, servers: Sequence[ServerState], regime: Regime) -> float:
        """What a change is valued over: how long the pool is expected to hold it. It commits
        the pool for its restart (drain and start-up) and the dwell, and goes on after that
        while the regime does: the commit plus the regime's expected rest beyond it. Over
        that span the regime fills its expected rest, the regimes after it what the commit
        has left once it ends: `mixture` weighs them so. A regime expected to last as long
        as the commit ends within it more often than not (its rest taken as exponential, as
        in `_outlasts`), and a change made for it is held under the next load meanwhile."""
        commit = self._commit(servers)
        now = regime.started_at + regime.elapsed_s
        within = self.regimes.expected_remaining(now, commit)
        return commit + max(0.0, regime.expected_remaining_s - within)

    def _commit(self, servers: Sequence[ServerState]) -> float:
        """How long a change commits the pool for: its restart (drain and start-up) and the
        dwell."""
        o = self.options
        return max((s.startup_s for s in servers), default=0.0) + o.drain_s + o.min_dwell_s

    def _lasting(self, servers: Sequence[ServerState]) -> bool:
        """Do the regimes seen last as long as a change commits the pool for (their median,
        `_commit`)? Only then is a pool that can restart a server under a higher load worth a
        loss now: in regimes shorter than that, a move made under the higher load would be
        held past it, and the option an escape buys is not one the loop takes. On the ramps
        (regimes of eight minutes) the escape moves at 32 and 64 users cost the seed 4% and
        the h200 shape 5%, and no move followed them; on the days (regimes of hours) a pool
        left deep at a few users lost 8% in the busy afternoon without them."""
        durations = self.regimes.durations
        return not durations or statistics.median(durations) >= self._commit(servers)

    def _loads(
        self, now: float, horizon_s: float, users: Mapping[str, float]
    ) -> list[tuple[float, dict[str, float]]]:
        """(weight, users per class) of each load the horizon is expected to hold; the same
        users seen twice are one load. Weights may sum to less than 1: what no regime seen
        tells is credited no gain."""
        merged: dict[_Load, float] = {}
        for weight, past in self.regimes.mixture(now, horizon_s):
            counts = users if past.duration_s == 0 else user_split(past.concurrency, past.shares)
            if counts:
                key = tuple(sorted(counts.items()))
                merged[key] = merged.get(key, 0.0) + weight
        return [(w, dict(k)) for k, w in merged.items()]

    def _value(
        self, settings: Sequence[Setting], loads: Sequence[tuple[float, Mapping[str, float]]],
        phys: Physics,
    ) -> float:  # fmt: skip
        """The objective of `settings` over the horizon: weighted over its loads."""
        return sum(w * self._forecast(settings, users, phys).value for w, users in loads)

    def _lane_tokens(
        self, current: Sequence[Setting], then: _Candidate,
        loads: Sequence[tuple[float, Mapping[str, float]]], phys: Physics,
    ) -> float:  # fmt: skip
        """How much of `then`'s gain over the horizon is the interactive lane's shortfall it
        avoids at the loads weighed, not tok/s (0 without a lane): a k3 server moved to k4 at
        one user read "157 -> 161 tok/s ...: gain 6447314 over 1020s", all of it the lane's
        charge at the 64 users seen, and the reason did not say so."""
        if self.lanes is None or then.gain <= 0:
            return 0.0
        avoided = sum(
            w * (self._forecast(current, u, phys).lane_charge
                 - self._forecast(then.settings, u, phys).lane_charge)
            for w, u in loads
        )  # fmt: skip
        return max(0.0, avoided) * then.gain_tokens / then.gain

    def _confirm(self, now: float, best: _Candidate | None) -> float:
        """How long the same target has been the paying proposal (0 when it is new)."""
        if best is None:
            self._proposal = None
            return 0.0
        if self._proposal is None or self._proposal[0] != best.settings:
            self._proposal = (best.settings, now)
        return now - self._proposal[1]

    def _forecast(
        self, settings: Sequence[Setting], users: Mapping[str, float], phys: Physics
    ) -> Forecast:
        o = self.options
        pool, speeds = self._seen
        fc = forecast_seen(settings, users, pool, phys, o.objective, o.floor_tok_s, speeds)
        return served_first(settings, fc, phys, self.lanes, users)

    def _search(
        self,
        servers: Sequence[ServerState],
        users: Mapping[str, float],
        phys: Physics,
        now_fc: Forecast,
        regime: Regime,
        horizon: tuple[float, Sequence[tuple[float, Mapping[str, float]]]],
        escape: float,
    ) -> tuple[_Candidate | None, _Candidate | None, _Held | None]:
        """(best paying candidate, best one that gains at all, best one the peak rule excludes
        that would gain) over the pools `search.candidates` gives (every multiset of settings
        in a pool of up to five servers), each valued over the horizon (its length, and the
        loads it is expected to hold)."""
        o = self.options
        horizon_s, loads = horizon
        current = tuple(s.setting for s in servers)
        now_value = self._value(current, loads, phys)
        unseen = _untold(loads)
        unknown = unseen * now_fc.value
        choices = [c for c in self.choices if c.deepest in phys.depths]
        if o.tables:
            choices += table_settings(phys, regime.shares, range(1, o.max_steps + 1))
        peak = self._peak(regime)
        # A restart runs under the load now while the regime lasts, and may meet the peak the
        # pool was sized for or has seen if the regime ends first: each server's loss is the
        # two weighed by the chance the regime outlasts its restart (`_outlasts`).
        at_peak = user_split(peak, regime.shares) if peak > regime.concurrency else users
        peak_fc = self._forecast(current, at_peak, phys)
        lost = []
        for i, server in enumerate(servers):
            now_loss = self._loss(servers, i, users, phys, now_fc)
            peak_loss = max(now_loss, self._loss(servers, i, at_peak, phys, peak_fc))
            stays = _outlasts(regime, server.startup_s + o.drain_s)
            lost.append(stays * now_loss + (1.0 - stays) * peak_loss)
        risks = self._risks(current, peak, regime, phys) if unseen > 0 else []
        best: _Candidate | None = None
        gaining: _Candidate | None = None
        held: _Held | None = None
        below = self.escape_load(current, phys) < escape and self._lasting(servers)
        for combo in candidates(current, choices):
            settings = _assign(current, combo)
            if settings == current or _undoes(servers, settings, regime):
                continue
            value = self._value(settings, loads, phys) - unseen * self._risk(settings, risks, phys)
            reach = self.escape_load(settings, phys)
            if below and reach >= escape:
                fc = self._forecast(settings, users, phys)
                out = self._candidate(servers, settings, fc, lost, value - now_value, horizon_s)
                if self._escaping is None or out.rank() > self._escaping.rank():
                    self._escaping = out
            if value - now_value <= max(0.0, self.bar * (now_value + unknown)):
                continue
            if reach < escape:
                if held is None or value - now_value > held.gain:
                    share = (value - now_value) / now_value if now_value > 0 else None
                    held = _Held(settings=settings, gain=value - now_value, escape=reach,
                                 share=share)  # fmt: skip
                continue
            fc = self._forecast(settings, users, phys)
            cand = self._candidate(servers, settings, fc, lost, value - now_value, horizon_s)
            if gaining is None or cand.rank() > gaining.rank():
                gaining = cand
            if (
                cand.pays(o.margin)
                and not _bets(regime, fc, now_fc)
                and (best is None or cand.rank() > best.rank())
            ):
                best = cand
        return best, gaining, held

    def _stranded(
        self,
        now: float,
        servers: Sequence[ServerState],
        start: Sequence[Change],
        target: _Candidate,
        at: tuple[Mapping[str, float], Physics, Forecast, Regime, float],
    ) -> bool:
        """Would `start`, part of `target`'s changes and gaining nothing now on its own (a
        server moved to make room for the rest), leave the pool where the rest no longer pays?
        Each step is planned afresh from the pool it leaves: the unseen load's charge and the
        bar are then counted from there, and a first step made for a target the next plan
        does not want again is a restart for nothing."""
        users, phys, now_fc, regime, escape = at
        if len(start) >= len(target.changes):
            return False
        moved = {c.server: c.after for c in start}
        after = [
            msgspec.structs.replace(s, setting=moved[s.name], previous=s.setting, changed_at=now)
            if s.name in moved else s
            for s in servers
        ]  # fmt: skip
        after_fc = self._forecast([s.setting for s in after], users, phys)
        if after_fc.value > now_fc.value * (1.0 + self.bar):
            return False  # it pays on its own
        horizon = self.horizon(after, regime)
        loads = self._loads(now, horizon, users)
        onward, _, _ = self._search(after, users, phys, after_fc, regime, (horizon, loads), escape)
        return onward is None

    def _peak(self, regime: Regime) -> float:
        """The load the pool may meet: the peak the operator named, else the slots of the
        pool as launched (`_sized`)."""
        return self._sized(self._launched, regime)

    def _sized(self, launched: float | None, regime: Regime) -> float:
        """The peak the operator named, else `launched` (what the pool as launched was sized
        for) until the load has moved (`Regime.load_moved`: the loads seen span two levels);
        then no more than `SEEN_HEADROOM` times the highest load seen. The highest load seen,
        at the least. A regime ended by a shift of the class mix alone is no move: at launch
        that shift ended the first quiet regime at 2 users in a wall-clock run, the floor fell
        to 4, and the busy phase after found two servers at k7 (-4.1% against three k3)."""
        o = self.options
        if o.peak_concurrency is not None:
            sized = o.peak_concurrency
        else:
            sized = launched or 0.0
            if regime.load_moved:
                sized = min(sized, SEEN_HEADROOM * regime.peak_concurrency)
        return max(sized, regime.peak_concurrency)

    def _risks(
        self, current: Sequence[Setting], peak: float, regime: Regime, phys: Physics
    ) -> list[tuple[dict[str, float], float]]:
        """The loads the part of the horizon no regime seen tells may hold, each with what
        the current pool yields there: the peak (`_peak`), of each class the pool knows. The
        pool was launched for them, and nothing seen says which comes (before the first
        regime ends, a quiet greedy spell says nothing of the busy sampled hour after it).
        None when the load now is the peak."""
        if peak <= regime.concurrency:
            return []
        known = sorted(set(phys.est.classes) | set(regime.shares))
        at_peak = (user_split(peak, {c: 1.0}) for c in known)
        return [(users, self._forecast(current, users, phys).value) for users in at_peak]

    def _risk(
        self,
        settings: Sequence[Setting],
        risks: Sequence[tuple[Mapping[str, float], float]],
        phys: Physics,
    ) -> float:
        """The most `settings` could lose against the current pool at one of `risks`, per
        second (0 when it loses at none): where no regime seen tells the load, a change is
        credited no gain and charged the worst it may meet."""
        lost = (value - self._forecast(settings, users, phys).value for users, value in risks)
        return max([0.0, *lost])

    def _untold_note(
        self, loads: Sequence[tuple[float, Mapping[str, float]]], regime: Regime
    ) -> str:
        """How much of the horizon no regime seen tells, when it is charged (`_risks`)."""
        untold, peak = _untold(loads), self._peak(regime)
        if untold <= 0 or peak <= regime.concurrency:
            return ""
        return f"; {untold:.0%} of it at loads not seen yet, charged the worst at {peak:.0f} users"

    def _held_note(self, held: _Held | None, shown: _Candidate | None, regime: Regime) -> str:
        """What the peak rule holds back, when it would gain more than what the plan shows:
        the rule is the operator's to lift, and a plan that says nothing of it looks stuck."""
        if held is None or (shown is not None and shown.gain >= held.gain):
            return ""
        floor = self._escape_floor(regime)
        if regime.peak_concurrency >= floor:
            why = "the highest load seen"
        elif self.options.peak_concurrency is not None:
            why = "`peak_concurrency`"
        elif floor < (self._launched_escape or 0.0):
            why = f"twice the highest load seen, {regime.peak_concurrency:.0f} users"
        else:
            why = "as the launched pool could; `peak_concurrency` names a lower peak"
        gain = (
            f"{held.share:+.1%} over the horizon"
            if held.share is not None
            else "a gain over the horizon, the interactive lane's shortfall counted"
        )
        return (
            f"; the peak rule holds back {'/'.join(s.label for s in held.settings)} "
            f"({gain}): it could restart a server only under "
            f"{held.escape:.0f} users, and the pool must stay able to under {floor:.0f} ({why})"
        )

    def _gainful_first(
        self,
        servers: Sequence[ServerState],
        cand: _Candidate,
        loads: Sequence[tuple[float, Mapping[str, float]]],
        phys: Physics,
        escape: float,
    ) -> _Candidate:
        """The target's changes in the order they begin: at each step, of the changes that
        leave the pool reconfigurable at `escape` once made (a pool on its way to its target
        is never stuck half-way: a server moved to make room goes first), the one bringing
        the most gain on its own (less its cost)."""
        if len(cand.changes) < 2:
            return cand
        names = [s.name for s in servers]
        moved = [s.setting for s in servers]
        base = self._value(moved, loads, phys)

        def alone(change: Change) -> float:
            trial = [s.setting for s in servers]
            trial[names.index(change.server)] = change.after
            gain = self._value(trial, loads, phys) - base
            return gain * self.options.min_dwell_s - change.cost_tokens

        left = sorted(cand.changes, key=alone, reverse=True)
        order: list[Change] = []
        while left:
            nxt = left[0]
            for change in left:
                trial = list(moved)
                trial[names.index(change.server)] = change.after
                if self.escape_load(trial, phys) >= escape:
                    nxt = change
                    break
            left.remove(nxt)
            order.append(nxt)
            moved[names.index(nxt.server)] = nxt.after
        return msgspec.structs.replace(cand, changes=tuple(order))

    def _escape_floor(self, regime: Regime) -> float:
        """The load every proposed pool, and every pool on the way to it, must stay
        reconfigurable at (`escape_load`): the peak the operator named, else what the launched
        pool could, until the load has moved (`_sized`). Agents at 24 users held a pool that
        could restart a server under 68, the launched pool's, from the k3/k7/k7 that ran their
        hour 10% faster."""
        return self._sized(self._launched_escape, regime)

    def _loss(
        self,
        servers: Sequence[ServerState],
        i: int,
        users: Mapping[str, float],
        phys: Physics,
        now_fc: Forecast,
    ) -> float:
        """Objective lost per second while server `i` is away: what it yields now, less what
        the others absorb of its load."""
        rest = [s.setting for j, s in enumerate(servers) if j != i]
        return max(0.0, now_fc.value - self._forecast(rest, users, phys).value)

    def _candidate(
        self,
        servers: Sequence[ServerState],
        settings: tuple[Setting, ...],
        fc: Forecast,
        lost: Sequence[float],
        gain: float,
        horizon_s: float,
    ) -> _Candidate:
        """A target's changes (cheapest first), its restart cost and its gain over the horizon
        (`gain` per second): restarts go `max_unavailable` at a time, each a drain plus a
        start-up, and the gain arrives as they are done (counted from the mean of the rounds'
        ends) until the end of the horizon its loads weigh `gain` over: later rounds only
        delay it (a span stretched by them would credit more restarts with more gain)."""
        o = self.options
        changes = sorted(
            (
                Change(server=server.name, before=server.setting, after=after,
                       cost_tokens=lost[i] * (server.startup_s + o.drain_s))
                for i, (server, after) in enumerate(zip(servers, settings, strict=True))
                if after != server.setting
            ),
            key=lambda c: c.cost_tokens,
        )  # fmt: skip
        restart_s = max(s.startup_s for s in servers) + o.drain_s
        rounds = math.ceil(len(changes) / o.max_unavailable)
        useful_s = max(0.0, horizon_s - (rounds + 1) / 2 * restart_s)
        return _Candidate(
            settings=settings,
            forecast=fc,
            changes=tuple(changes),
            gain=gain,
            gain_tokens=gain * useful_s,
            cost=sum(c.cost_tokens for c in changes),
        )

    def escape_load(self, settings: Sequence[Setting], phys: Physics) -> float:
        """The highest load under which one server of `settings` can still restart while the
        others hold it (their admission limits); a pool at a load above it is stuck there
        under the capacity floor of `_startable`. New pools must stay escapable at the load
        the launched pool was (its limits, not its slots: a pool launched at 17 slots a
        server and twice that in limits escapes at 68 users, not 51), or at the peak the
        operator named (`peak_concurrency`), or at the highest load seen."""
        if len(settings) < 2:
            return math.inf
        limits = [self.options.overcommit * phys.depths[s.deepest].capacity for s in settings]
        return sum(limits) - min(limits)

    def _startable(
        self,
        now: float,
        servers: Sequence[ServerState],
        cand: _Candidate,
        regime: Regime,
        phys: Physics,
    ) -> tuple[tuple[Change, ...], str]:
        """The changes that may begin now (dwell, max_unavailable, capacity floor: the other
        serving servers' admission limits hold the current concurrency), and why others wait.
        The dwell holds a server changed in this regime only: a regime that has settled since
        may change it again (a move made for a quiet spell is not held through the busy hour
        after it; flapping load is held back by the horizon's valuation across the regimes
        seen, and by `settle_s` and `confirm_s`, as before)."""
        o = self.options
        by_name = {s.name: s for s in servers}
        busy = sum(1 for s in servers if s.state != "serving")
        start: list[Change] = []
        why = ""
        for change in cand.changes:
            server = by_name[change.server]
            if busy + len(start) >= o.max_unavailable:
                why = why or f"max_unavailable {o.max_unavailable} reached"
                break
            if server.state != "serving":
                continue
            if (
                server.changed_at is not None
                and now - server.changed_at < o.min_dwell_s
                and server.changed_at >= regime.started_at
            ):
                why = why or f"{server.name} changed {now - server.changed_at:.0f}s ago, in dwell"
                continue
            leaving = {server.name, *(c.server for c in start)}
            room = sum(
                self._limit(s, phys)
                for s in servers
                if s.state == "serving" and s.name not in leaving
            )
            if regime.concurrency > room:
                why = (
                    why or f"capacity floor: the others hold {room:.0f} < {regime.concurrency:.0f}"
                )
                continue
            if why and self._strands([*start, change], servers, regime, phys):
                continue  # its turn is after a change that waits
            start.append(change)
        return tuple(start), why

    def _strands(
        self, changes: Sequence[Change], servers: Sequence[ServerState], regime: Regime,
        phys: Physics,
    ) -> bool:  # fmt: skip
        """Would `changes`, begun out of their target's order (`_gainful_first`) because one
        before them waits, leave a pool less reconfigurable than both the floor and the pool
        now? A k1 server moved to k5 while the server that was to make room sat in its
        dwell left the h200 shape's swing on k3/k5/k7, which could not restart a server at
        the busy hour's 64 users, where the rest of the target no longer paid: stuck deep
        for the hour."""
        now = [s.setting for s in servers]
        moved = {c.server: c.after for c in changes}
        after = [moved.get(s.name, s.setting) for s in servers]
        floor = min(self._escape_floor(regime), self.escape_load(now, phys))
        return self.escape_load(after, phys) < floor

    def _limit(self, server: ServerState, phys: Physics) -> float:
        if server.limit is not None:
            return float(server.limit)
        return self.options.overcommit * phys.depths[server.setting.deepest].capacity


def _untold(loads: Sequence[tuple[float, Mapping[str, float]]]) -> float:
    """The share of the horizon no regime seen tells (`RegimeTracker.mixture`)."""
    return max(0.0, 1.0 - sum(w for w, _ in loads))


def _undoes(servers: Sequence[ServerState], settings: Sequence[Setting], regime: Regime) -> bool:
    """Would `settings` put a server back where it was before a change made in this regime?
    The estimates that moved it have not changed their mind for a reason the regime shows."""
    return any(
        s.previous == after and s.changed_at is not None and s.changed_at >= regime.started_at
        for s, after in zip(servers, settings, strict=True)
    )


def _bets(regime: Regime, target: Forecast, now_fc: Forecast) -> bool:
    """Would `target`, which yields less than the pool under the load now, bet on how long a
    regime lasts that no regime alike has shown? Its gain is in the loads that follow, and the
    current one's length is a guess (`RegimeTracker.expected_remaining`): a sampled hour taken
    to last as long as the greedy spell before it sends servers deep for the greedy regime to
    come, and the hour runs on them. Once a regime alike has ended, its length is learned and
    such a change may go ahead (the best single pool across regimes that flip fast); until
    then the change waits for the load it is made for, and is planned there."""
    return target.value < now_fc.value and regime.alike_seen == 0


def _unsettled(regime: Regime, settle_s: float, users: Mapping[str, float]) -> str:
    """Why the regime is not one to act on yet ("" when it is)."""
    if not users:
        return "idle"
    if regime.elapsed_s < settle_s:
        return f"regime {regime.elapsed_s:.0f}s old < {settle_s:.0f}s"
    if not regime.steady:
        return f"load moving away from {regime.concurrency:.1f}"
    return ""


def _outlasts(regime: Regime, restart_s: float) -> float:
    """The chance the regime goes on past a restart of `restart_s`, its remaining time taken
    as exponential with the mean it is expected to last."""
    if regime.expected_remaining_s <= 0:
        return 0.0
    return math.exp(-restart_s / regime.expected_remaining_s)


def _assign(current: tuple[Setting, ...], combo: tuple[Setting, ...]) -> tuple[Setting, ...]:
    """`combo` mapped onto the servers with the fewest changes: a server whose setting is in
    the combo keeps it; the rest take what is left, in order."""
    left = list(combo)
    kept: list[Setting | None] = []
    for s in current:
        if s in left:
            left.remove(s)
            kept.append(s)
        else:
            kept.append(None)
    fill = iter(left)
    return tuple(s if s is not None else next(fill) for s in kept)


def _numbers(
    now_fc: Forecast, c: _Candidate, regime: Regime, horizon: float, loads: int,
    lane_tokens: float = 0.0,
) -> str:  # fmt: skip
    seen = f" and {loads - 1} other loads seen" if loads > 1 else ""
    lane = ""
    if lane_tokens >= 0.5:  # more than all of it where the change costs tok/s for the lane
        lane = f" ({lane_tokens:.0f} of it the interactive lane's shortfall at the loads seen)"
    return (
        f"{_figure(now_fc)} -> {_figure(c.forecast)} at {regime.concurrency:.1f} "
        f"users{seen}: gain {c.gain_tokens:.0f}{lane} over {horizon:.0f}s vs restart cost "
        f"{c.cost:.0f}"
    )


def _figure(fc: Forecast) -> str:
    """A pool and its objective's figure (tok/s for `throughput`), and where the interactive
    lane is short, what the planner ranks it by once that is charged: a pool's figure never
    reads as a negative tok/s (`k1/k1/k1 -619`)."""
    pool = f"{'/'.join(fc.settings)} {fc.value + fc.lane_charge:.0f}"
    if fc.lane_charge <= 0:
        return pool
    return f"{pool} ({fc.value:.0f} with the lane's shortfall charged)"
