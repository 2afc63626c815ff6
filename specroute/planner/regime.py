"""Load regimes: smoothed concurrency and class mix, when they leave a band, how long regimes
last, and how long the current one is expected to go on. Pure; time is an argument."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import msgspec

__all__ = ["Past", "Regime", "RegimeTracker"]

_SMALL = 2.0
"""Added to concurrency before comparing levels, so 1 -> 2 users is not a new regime."""


class Regime(msgspec.Struct, frozen=True, kw_only=True):
    """The load regime now: smoothed concurrency (queued requests included) and class shares."""

    concurrency: float
    shares: dict[str, float]
    started_at: float
    elapsed_s: float
    expected_remaining_s: float
    regimes_seen: int
    """Regimes that ended, whose lengths teach `expected_remaining_s`."""
    alike_seen: int = 0
    """Of those, the regimes of the current one's load and mix. Until one has ended, how long
    this one lasts is a guess (the prior, or the lengths of other loads)."""
    peak_concurrency: float
    steady: bool
    """Load is not moving: the band has not moved for a window and the latest sample lies in it."""
    load_moved: bool = False
    """The loads seen span two levels: the level of an ended regime, or of the current one,
    lies outside the band of another's. Not so when only the class mix moved: the first
    `/pool` answer is split by the prior's samples and the next by the traffic's, and that
    shift ends the first regime at the load it began at."""
    steady_since: float = -math.inf
    """Since when it has been (the latest sample at which it was not). A rate read from
    before then may be of another load, or of the last one's replies still ending: a step from
    64 users to 32 inside one regime's band put a pool that ran 2947 tok/s at 3499."""


class Past(msgspec.Struct, frozen=True, kw_only=True):
    """A regime that ended: how long it lasted, its load and its class mix."""

    duration_s: float
    concurrency: float
    shares: dict[str, float]


class RegimeTracker:
    """Load as a mean over the last `window_s` of samples (taken at a steady pace); a regime
    ends when that concurrency leaves `band` (a ratio) around the regime's level or the class
    mix moves by `mix_shift` (total variation). The band then moves to the new level; when it
    had moved less than a window before, load is still on its way (a ramp) and no regime ends.
    Expected remaining time is the mean residual of the past regimes of the same load and mix
    that outlasted the current one's age, with a prior counted `prior_weight` times."""

    def __init__(
        self,
        *,
        band: float = 1.5,
        mix_shift: float = 0.25,
        window_s: float = 60.0,
        prior_s: float = 1800.0,
        prior_weight: float = 1.0,
        min_s: float = 0.0,
        history: int = 64,
    ) -> None:
        self.band = band
        self.mix_shift = mix_shift
        self.window_s = window_s
        self.prior_s = prior_s
        self.prior_weight = prior_weight
        self.min_s = min_s
        """How long a regime lasts at the least, as the operator knows it (0: not known)."""
        self.past: deque[Past] = deque(maxlen=history)
        """The regimes that ended, latest last: the load the pool has actually seen."""
        self.level = 0.0
        self.shares: dict[str, float] = {}
        self.peak = 0.0
        self.latest = 0.0
        self._samples: deque[tuple[float, Mapping[str, float]]] = deque()
        self._sums: dict[str, float] = {}
        self._start: float | None = None
        self._moved = 0.0
        self._unsteady_at = -math.inf
        self._ref_level = 0.0
        self._ref_shares: dict[str, float] = {}
        self._mix: dict[str, float] = {}
        """Requests in flight per class, summed over the samples since the reference last moved
        (seeded with the window's): the class mix the regime has had, steadier than a window's
        at a few users."""

    @property
    def durations(self) -> list[float]:
        """How long each regime that ended lasted, latest last."""
        return [p.duration_s for p in self.past]

    def observe(self, now: float, by_class: Mapping[str, float]) -> None:
        """One sample of the requests in flight or queued, per workload class."""
        sample = self._slide(now, by_class)
        if self._start is None:
            self._start = self._moved = self._unsteady_at = now
            self._rebase()
            return
        for c, n in sample.items():
            self._mix[c] = self._mix.get(c, 0.0) + n
        self.peak = max(self.peak, self.level)
        if self._left():
            if now - self._moved >= self.window_s:
                self.past.append(Past(duration_s=now - self._start, concurrency=self._ref_level,
                                      shares=self.mix))  # fmt: skip
                self._start = now
            self._moved = now
            self._rebase()
        if not self._steady(now):
            self._unsteady_at = now

    def _rebase(self) -> None:
        """The reference moves to the load now: the band, and the mix from the window's
        samples within the band of it. A window that still holds the busy hour's samples
        (48 sampled users each) seeded a quiet regime of two greedy users with a sampled mix
        it took more than the regime's length to outweigh."""
        self._ref_level, self._ref_shares = self.level, dict(self.shares)
        mix: dict[str, float] = {}
        for _, sample in self._samples:
            if not self._outside(sum(sample.values()), self.level):
                for c, n in sample.items():
                    mix[c] = mix.get(c, 0.0) + n
        self._mix = {c: n for c, n in mix.items() if n > 1e-9}

    @property
    def mix(self) -> dict[str, float]:
        """The class shares since the reference last moved (`_mix`), else the window's."""
        total = sum(self._mix.values())
        if total <= 1e-9:
            return dict(self.shares)
        return {c: n / total for c, n in self._mix.items() if n > 1e-9}

    def _slide(self, now: float, by_class: Mapping[str, float]) -> dict[str, float]:
        """Add the sample, drop those older than the window, refresh level and shares."""
        sample = {c: float(n) for c, n in by_class.items() if n > 0}
        self.latest = sum(sample.values())
        self._samples.append((now, sample))
        for c, n in sample.items():
            self._sums[c] = self._sums.get(c, 0.0) + n
        while self._samples[0][0] <= now - self.window_s:
            for c, n in self._samples.popleft()[1].items():
                self._sums[c] -= n
        total = sum(self._sums.values())
        self.level = total / len(self._samples)
        if total > 1e-9:
            self.shares = {c: n / total for c, n in self._sums.items() if n > 1e-9}
        return sample

    def _outside(self, level: float, ref: float) -> bool:
        ratio = (level + _SMALL) / (ref + _SMALL)
        return ratio > self.band or ratio < 1.0 / self.band

    def _left(self) -> bool:
        return self._differ(self.level, self.shares, self._ref_level, self._ref_shares)

    def _differ(
        self, level: float, shares: Mapping[str, float], ref: float, ref_shares: Mapping[str, float]
    ) -> bool:
        """Two loads are different regimes: concurrency out of band, or the mix moved. A
        mix among a few requests moves by chance (two users are half sampled whenever one
        is): the shift counts `n / (n + 2)` of itself at the smaller load `n`, as levels do."""
        if self._outside(level, ref):
            return True
        keys = set(shares) | set(ref_shares)
        shift = 0.5 * sum(abs(shares.get(c, 0.0) - ref_shares.get(c, 0.0)) for c in keys)
        few = min(level, ref)
        return shift * few / (few + _SMALL) > self.mix_shift

    def expected_remaining(self, now: float, within_s: float = math.inf) -> float:
        """Mean residual life of the current regime at its age, learned with a prior: as long
        again as it has lasted (at least a window, at most `prior_s`), the guess when nothing
        says how long regimes last. The prior counts for less as regimes are seen
        (`prior_weight / (1 + seen)`): a few short regimes outweigh it, and a regime older than
        every one like it is expected to last a share of as long again (`_residual`), not
        `prior_s` at once.

        The regimes of its load and mix teach it when any has ended. Until then the regimes of
        other loads give an estimate it never falls under the prior's: how long a quiet spell
        lasted says little of the busy regime after it, and taken alone it had a busy regime
        older than the spell expected to end within seconds, while changes back to busy depths
        waited.

        With `within_s`, the expected part of the next `within_s` the regime fills (the mean
        of the residual cut at `within_s`), from the same residuals and the prior taken as
        exponential: a regime expected to last as long as the span fills 63% of it, not all.

        Never less than what `min_s` leaves of the regime (the operator's word that regimes
        last that long), of the span where one is given."""
        age = now - (self._start if self._start is not None else now)
        left = min(max(0.0, self.min_s - age), within_s)
        again = min(self.prior_s, max(age, self.window_s))
        alike = [p.duration_s for p in self.past if self.alike(p)]
        prior = again if math.isinf(within_s) else again * -math.expm1(-within_s / again)
        if alike:
            learned = self._residual(alike, age, prior, within_s)
        elif not self.past:
            learned = prior
        else:
            learned = max(prior, self._residual(self.durations, age, prior, within_s))
        return max(left, learned)

    def _residual(self, durations: list[float], age: float, prior: float, cut: float) -> float:
        """The mean residual at `age` of `durations`, each cut at `cut`, with `prior`. Past the
        longest of them, the prior weighs against that one as if it ended now, counted by the
        chance a regime like it lives to this age when lengths have a Lindy tail
        (`longest / age`): a regime that has just outlived every one like it is expected to
        last about `weight / (weight + 1)` as long again as it has, not as long again (a jump
        there from what the longest had left drew moves in a regime's last minutes), and one
        that has outlived them many times over nearly as long again (a spell of 130 s at
        start-up does not make an hour-long quiet regime expected to end within minutes)."""
        residuals = [min(d - age, cut) for d in durations if d > age]
        weight = self.prior_weight / (1 + len(durations))
        count = len(residuals) if residuals else min(1.0, max(durations) / max(age, 1e-9))
        return (weight * prior + sum(residuals)) / (weight + count)

    @property
    def load(self) -> Past:
        """The current regime's load and mix (no duration: it has not ended)."""
        return Past(duration_s=0.0, concurrency=self._ref_level, shares=self.mix)

    def alike(self, past: Past) -> bool:
        """Was `past` a regime of the current one's load and mix? Their lengths teach how
        long this one lasts (a quiet spell between long busy ones is itself short)."""
        return not self._differ(past.concurrency, past.shares, self._ref_level, self.mix)

    def mixture(self, now: float, horizon_s: float) -> list[tuple[float, Past]]:
        """The load over the next `horizon_s`, as weights on regimes: the current one for as
        long as it is expected to last, the rest of the horizon shared by the regimes seen
        lately (the latest ones covering twice the horizon) in proportion to how long each
        lasted. Weights sum to less than 1 when no regime has ended yet: the rest of the
        horizon is unknown, until the first regime has outlived `prior_s`: the load the pool
        was started into, held that long, is seen (before, the caution for load not seen yet
        lapsed only when a regime ended, and on a quiet night of two users that was a window
        whose mix read all greedy by chance, an hour in)."""
        current = Past(duration_s=0.0, concurrency=self.level, shares=self.mix)
        if not self.past and self._start is not None and now - self._start >= self.prior_s:
            return [(1.0, current)]
        stay = min(1.0, self.expected_remaining(now) / horizon_s) if horizon_s > 0 else 1.0
        recent: list[Past] = []
        for past in reversed(self.past):
            if sum(p.duration_s for p in recent) >= 2 * horizon_s:
                break
            recent.append(past)
        seen = sum(p.duration_s for p in recent)
        if stay >= 1.0 or seen <= 0:
            return [(stay, current)]
        return [(stay, current), *(((1 - stay) * p.duration_s / seen, p) for p in recent)]

    def view(self, now: float) -> Regime:
        return Regime(
            concurrency=self.level,
            shares=dict(sorted(self.mix.items())),
            started_at=now if self._start is None else self._start,
            elapsed_s=0.0 if self._start is None else now - self._start,
            expected_remaining_s=self.expected_remaining(now),
            regimes_seen=len(self.past),
            alike_seen=sum(1 for p in self.past if self.alike(p)),
            peak_concurrency=self.peak,
            load_moved=self._load_moved(),
            steady=self._steady(now),
            steady_since=self._unsteady_at,
        )

    def _load_moved(self) -> bool:
        levels = [p.concurrency for p in self.past]
        if not levels:
            return False
        levels.append(self._ref_level)
        return self._outside(max(levels), min(levels))

    def _steady(self, now: float) -> bool:
        return now - self._moved >= self.window_s and not self._outside(self.latest, self.level)
