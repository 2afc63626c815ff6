"""What a depth assignment would give a load regime: each server's running requests, tok/s and
per-request speed, from the estimated E_k per class, T(b, k) and R(k) per depth, and each
class's mean reply length, first-token wait and prefill pause.

A request's time is its first token's wait (its class's wait beyond one iteration, plus one
iteration), then its other tokens at E_k per iteration, and the pauses for the prefills of
the requests that start beside it: about one per other user on its server, whatever the
depth, so a larger share of a deep server's shorter requests. A user in flight yields its
request's tokens over that whole time. On a class of long prompts the wait is a tenth of a
short reply's time, and a forecast that left it out promised a deep server's requests more
than they ran (`docs/policy-evaluation.md`, item 30); the pauses, a third of a busy server's
time, the same of any depth it did not run (item 31).

Users are placed one at a time where the routing policy would send them (largest gain in pool
tok/s, fastest speed for `latency`), so a forecast of a mixed pool credits class sorting while
slots are plenty; once nearly all are taken, no routing can sort, and neither does the forecast.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import msgspec

from specroute.planner.estimates import Estimates
from specroute.speculation import Curve

__all__ = [
    "Forecast",
    "Objective",
    "Physics",
    "ServerForecast",
    "Setting",
    "Table",
    "Tier",
    "forecast",
    "forecast_seen",
    "held_under",
    "user_counts",
    "user_split",
]

Objective = Literal["throughput", "latency", "goodput"]
SORTING_LIMIT = 0.8
"""Occupancy (users over slots) up to which routing places each class where it gains most."""
_WHOLE = 1e-9
"""Parts of a user below this are none."""
Tier = tuple[int, tuple[int, ...]]
"""(smallest batch size of the tier, candidate depths): SGLang's adaptive configuration."""
Table = tuple[tuple[int, int], ...]
"""(first batch size, K) ranges, the first from 1: vLLM's `num_speculative_tokens_per_batch_size`
(each range runs to the next one's first batch size less one, the last to the batch limit)."""


class Setting(msgspec.Struct, frozen=True, kw_only=True):
    """A server's speculative configuration: `steps` fixed, SGLang-adaptive over `tiers`
    (started at `steps`, memory sized for the deepest candidate), or vLLM's K per batch size
    from `table` (`steps` is its `num_speculative_tokens`, the most it drafts)."""

    steps: int
    tiers: tuple[Tier, ...] = ()
    table: Table = ()

    @property
    def deepest(self) -> int:
        """The depth that sizes its memory, so its running capacity."""
        return max([self.steps, *(k for _, ks in self.tiers for k in ks)])

    @property
    def label(self) -> str:
        if self.table:
            return f"dynamic<={self.steps}"
        return f"adaptive<={self.deepest}" if self.tiers else f"k{self.steps}"

    def table_depth(self, batch: float) -> int:
        """K for a step of `batch` requests, as vLLM's scheduler looks it up (the range
        holding it; an empty step, the first range's)."""
        running = max(1, round(batch))
        return next(k for first, k in reversed(self.table) if first <= running)


class ServerForecast(msgspec.Struct, frozen=True, kw_only=True):
    setting: str
    steps: int
    """The depth it runs at under this load (an adaptive server's chosen tier depth)."""
    running: float
    tok_s: float
    per_request_tok_s: float


class Forecast(msgspec.Struct, frozen=True, kw_only=True):
    """Predicted steady state of one assignment; `value` is the objective's figure."""

    settings: tuple[str, ...]
    tok_s: float
    per_request_tok_s: float
    queued: float
    value: float
    servers: tuple[ServerForecast, ...]
    lane_charge: float = 0.0
    """What the interactive lane's shortfall took off `value` (`lanes.served_first`), by
    which the planner ranks: the objective's own figure is `value + lane_charge`."""
    class_speed: dict[str, float] = msgspec.field(default_factory=dict)
    """Each class's mean per-request tok/s over the servers running it (`held_under`)."""


class Physics:
    """E_k per class and T(b, k) per depth, looked up once per plan: every forecast of a plan
    reads the same estimates."""

    def __init__(self, est: Estimates) -> None:
        self.est = est
        self.depths = est.depths
        self._e: dict[tuple[str, int], float] = {}
        self._curves: dict[str, Curve] = {}
        self._t: dict[tuple[int, float], float] = {}
        self.rates: dict[tuple[object, ...], tuple[int, float, dict[str, float]]] = {}
        """A server's (depth, tok/s, speed by class) per setting and class counts
        (`_Server.rates`): a plan places the same few counts on the same settings over and
        over, and reading T between tune's points is most of a forecast's time."""
        self.whole: dict[tuple[object, ...], Forecast] = {}
        """Forecasts of whole users, kept: the mixes of fractional users recur (`forecast`)."""
        self._first: dict[str, tuple[float, float, float] | None] = {}

    def first_token(self, klass: str) -> tuple[float, float, float] | None:
        """(mean reply tokens, first-token wait beyond one iteration, pause per other
        request) of `klass`, where the pool has seen its length and wait (no pause seen:
        none)."""
        if klass not in self._first:
            est = self.est.classes.get(klass)
            tokens = None if est is None else est.mean_tokens
            wait = None if est is None else est.first_token_s
            pause = (None if est is None else est.prefill_pause_s) or 0.0
            known = None if not tokens or wait is None else (max(1.0, tokens), wait, pause)
            self._first[klass] = known
        return self._first[klass]

    def speed(self, klass: str, steps: int, seconds: float, batch: float = 1.0) -> float:
        """A `klass` request's tok/s over its whole time on a server at `steps` running
        `batch` requests whose decode iteration takes `seconds`: its first token after its
        wait and one iteration, the rest at E_k per iteration, and a pause for each of the
        other requests' starts (without a wait seen, E_k per iteration from the first)."""
        per_iteration = self.e(klass, steps) / seconds
        first = self.first_token(klass)
        if first is None:
            return per_iteration
        tokens, wait, pause = first
        paused = pause * max(0.0, batch - 1.0)
        return tokens / (wait + seconds + (tokens - 1.0) / per_iteration + paused)

    def e(self, klass: str, steps: int) -> float:
        key = (klass, steps)
        value = self._e.get(key)
        if value is None:
            curve = self._curves.get(klass)
            if curve is None:
                curve = self._curves[klass] = self.est.curve(klass)
            value = self._e[key] = curve.at(steps)
        return value

    def time(self, steps: int, batch: float) -> float:
        key = (steps, batch)
        value = self._t.get(key)
        if value is None:
            value = self._t[key] = self.depths[steps].iteration_time(batch)
        return value


class _Server:
    """One server while users are placed: its class counts and what they yield."""

    __slots__ = ("capacity", "counts", "phys", "running", "scored", "setting", "tok_s")

    def __init__(self, setting: Setting, phys: Physics) -> None:
        self.setting = setting
        self.phys = phys
        self.capacity = phys.depths[setting.deepest].capacity
        self.counts: dict[str, float] = {}
        self.running = 0.0
        self.tok_s = 0.0
        self.scored: dict[tuple[str, Objective, float], float | None] = {}
        """`score`'s answers since the counts last changed: a user placed elsewhere leaves
        this server's scores as they were, so each placement scores one server afresh (the
        one that took the last user), not all of them. Most of a plan's time was spent here."""

    def depth(self, counts: Mapping[str, float], batch: float) -> int:
        """The depth at `batch` running: fixed, or where SGLang's tier rule settles (step
        down while accepted drafts per verify are at most the lower depth - 0.5, up while
        they exceed this depth - 0.5), from the tier's deepest candidate."""
        s = self.setting
        if s.table:
            return s.table_depth(batch)
        if not s.tiers or batch <= 0:
            return s.steps
        tier = sorted(s.tiers[0][1])
        for smallest, candidates in s.tiers:
            if batch >= smallest:
                tier = sorted(candidates)
        i = len(tier) - 1
        e = self.phys.e
        while i > 0:
            accepted = sum(n * e(c, tier[i]) for c, n in counts.items()) / batch - 1
            if accepted > (0.5 if tier[i - 1] == 0 else tier[i - 1] - 0.5):
                break
            i -= 1
        return tier[i]

    def rates(self, counts: Mapping[str, float]) -> tuple[int, float, dict[str, float]]:
        """(depth, tok/s, per-request speed by class) with `counts` running (kept in
        `Physics.rates`; not to be changed)."""
        key = (self.setting, *sorted(counts.items()))
        known = self.phys.rates.get(key)
        if known is not None:
            return known
        batch = sum(counts.values())
        k = self.depth(counts, batch)
        t = self.phys.time(k, batch)
        speeds = {c: self.phys.speed(c, k, t, batch) for c in counts}
        known = self.phys.rates[key] = (k, sum(n * speeds[c] for c, n in counts.items()), speeds)
        return known

    def joined(self, klass: str) -> dict[str, float]:
        counts = dict(self.counts)
        counts[klass] = counts.get(klass, 0) + 1
        return counts

    def score(self, klass: str, objective: Objective, floor: float) -> float | None:
        """What one more `klass` user here scores: the gain in tok/s, or its own speed for
        `latency`; None for `goodput` when a request here would fall under the floor."""
        key = (klass, objective, floor)
        if key in self.scored:
            return self.scored[key]
        _, tok_s, speeds = self.rates(self.joined(klass))
        value: float | None
        if objective == "latency":
            value = speeds[klass]
        elif objective == "goodput" and min(speeds.values()) < floor:
            value = None
        else:
            value = tok_s - self.tok_s
        self.scored[key] = value
        return value

    def join(self, klass: str) -> None:
        self.counts = self.joined(klass)
        self.running += 1
        self.tok_s = self.rates(self.counts)[1]
        self.scored.clear()


def user_split(concurrency: float, shares: Mapping[str, float]) -> dict[str, float]:
    """`concurrency` users (rounded to whole users) split by `shares`, each class's part
    kept exact: at two users a tenth of the requests in a slow class holds a fifth of the
    time, which rounding to whole users hid (`forecast` weighs the whole-user mixes)."""
    users = round(concurrency)
    total = sum(shares.values())
    if users <= 0 or total <= 0:
        return {}
    return {c: users * s / total for c, s in sorted(shares.items()) if s > 0}


def compositions(users: Mapping[str, float]) -> list[tuple[float, dict[str, int]]]:
    """(weight, whole users per class) whose weighted mean is `users`: each class keeps its
    whole users and its fraction of one more is the weight of the mixes where it has it
    (systematic rounding over the classes in name order). Whole users give one mix."""
    floors = {c: math.floor(x + _WHOLE) for c, x in users.items()}
    parts = {c: max(0.0, x - floors[c]) for c, x in users.items()}
    if all(r < _WHOLE for r in parts.values()):
        return [(1.0, {c: n for c, n in floors.items() if n > 0})]
    ends: list[tuple[str, float, float]] = []
    edge = 0.0
    for c in sorted(parts):
        ends.append((c, edge, edge + parts[c]))
        edge += parts[c]
    cuts = sorted({0.0, 1.0, *(e % 1.0 for _, _, e in ends)})
    merged: dict[tuple[tuple[str, int], ...], float] = {}
    for lo, hi in itertools.pairwise(cuts):
        if hi - lo < _WHOLE:
            continue
        u = (lo + hi) / 2
        mix = dict(floors)
        for c, a, b in ends:
            mix[c] += math.ceil(b - u) - math.ceil(a - u)
        key = tuple(sorted((c, n) for c, n in mix.items() if n > 0))
        merged[key] = merged.get(key, 0.0) + hi - lo
    return [(w, dict(k)) for k, w in merged.items()]


def user_counts(concurrency: float, shares: Mapping[str, float]) -> dict[str, int]:
    """Whole users per class for `concurrency` users split by `shares` (largest remainder)."""
    users = round(concurrency)
    total = sum(shares.values())
    if users <= 0 or total <= 0:
        return {}
    exact = {c: users * s / total for c, s in sorted(shares.items())}
    counts = {c: int(x) for c, x in exact.items()}
    by_remainder = sorted(exact, key=lambda c: counts[c] - exact[c])
    for c in by_remainder[: users - sum(counts.values())]:
        counts[c] += 1
    return {c: n for c, n in counts.items() if n > 0}


def forecast_seen(
    settings: Sequence[Setting],
    users: Mapping[str, float],
    seen_on: Sequence[Setting],
    phys: Physics,
    objective: Objective = "throughput",
    floor_tok_s: float = 0.0,
    speeds: dict[tuple[tuple[str, float], ...], dict[str, float]] | None = None,
) -> Forecast:
    """`forecast` of `settings` for `users` seen in flight on the pool `seen_on`: where the
    classes run at other speeds than there, the users in flight are what the same mix of
    requests holds (`held_under`). `speeds` keeps each load's per-class speed on `seen_on`
    between calls with the same `phys`."""
    fc = forecast(settings, users, phys, objective, floor_tok_s)
    if len(users) < 2 or not seen_on or tuple(settings) == tuple(seen_on):
        return fc
    key = tuple(sorted(users.items()))
    seen = None if speeds is None else speeds.get(key)
    if seen is None:
        seen = forecast(seen_on, users, phys, objective, floor_tok_s).class_speed
        if speeds is not None:
            speeds[key] = seen
    held = held_under(users, seen, fc.class_speed)
    return fc if held == users else forecast(settings, held, phys, objective, floor_tok_s)


def held_under(
    users: Mapping[str, float], seen: Mapping[str, float], speed: Mapping[str, float]
) -> dict[str, float]:
    """The users in flight per class that `users`, seen in flight where each class ran at
    `seen` tok/s per request, become where it runs at `speed`: the same total, each class's
    share scaled by seen / speed. A closed-loop user's requests come in a mix of classes
    that depth does not change; a request stays in flight as long as its tokens take, so a
    class that a depth speeds up more (greedy, past the first draft) holds fewer of the
    users in flight there. Holding the in-flight mix instead overstated a deep pool's tok/s
    by up to a third on a mixed load (`benchmarks/forecast_mix.py`)."""
    weights = {
        c: n * seen[c] / speed[c] if seen.get(c, 0.0) > 0 and speed.get(c, 0.0) > 0 else n
        for c, n in users.items()
    }
    total, weight = sum(users.values()), sum(weights.values())
    return {c: total * w / weight for c, w in weights.items()} if weight > 0 else dict(users)


def _order(counts: Mapping[str, int]) -> list[str]:
    """Users' classes interleaved in proportion, as they would arrive."""
    spots = [((j + 0.5) / n, c) for c, n in counts.items() for j in range(n)]
    return [c for _, c in sorted(spots)]


def _place(servers: list[_Server], klass: str, objective: Objective, floor: float) -> bool:
    """Send one user where the policy would; False when every server is full."""
    best: _Server | None = None
    best_score = -math.inf
    fallback: list[_Server] = []
    for server in servers:
        if server.running >= server.capacity:
            continue
        fallback.append(server)
        score = server.score(klass, objective, floor)
        if score is not None and score > best_score:
            best, best_score = server, score
    if best is None and fallback:
        # goodput with no server keeping the floor: the fastest, as the policy does
        best = max(fallback, key=lambda s: s.score(klass, "latency", floor) or 0.0)
    if best is None:
        return False
    best.join(klass)
    return True


def _blind(servers: list[_Server], users: Mapping[str, int]) -> int:
    """Users spread in proportion to capacity, each server running the overall class mix:
    the placement when slots are scarce (returns the users queued)."""
    total = sum(users.values())
    slots = sum(s.capacity for s in servers)
    fill = min(1.0, total / slots)
    for server in servers:
        server.counts = {c: server.capacity * fill * n / total for c, n in users.items()}
        server.running = server.capacity * fill
        server.tok_s = server.rates(server.counts)[1] if server.counts else 0.0
        server.scored.clear()
    return max(0, total - slots)


def _summary(
    servers: list[_Server], queued: float, objective: Objective, floor_tok_s: float
) -> Forecast:
    out: list[ServerForecast] = []
    tok_s = good = 0.0
    held: dict[str, float] = {}
    made: dict[str, float] = {}
    for server in servers:
        k, thr, speeds = server.rates(server.counts) if server.counts else (0, 0.0, {})
        good += sum(n * v for c, n in server.counts.items() if (v := speeds[c]) >= floor_tok_s)
        tok_s += thr
        for c, n in server.counts.items():
            held[c] = held.get(c, 0.0) + n
            made[c] = made.get(c, 0.0) + n * speeds[c]
        out.append(
            ServerForecast(
                setting=server.setting.label,
                steps=k if server.counts else server.setting.steps,
                running=server.running,
                tok_s=thr,
                per_request_tok_s=thr / server.running if server.running else 0.0,
            )
        )
    running = sum(s.running for s in servers)
    # Closed-loop users: the mean user's speed, queue wait included, is tok/s over users.
    values = {
        "throughput": tok_s,
        "latency": tok_s / (running + queued) if running + queued else 0.0,
        "goodput": good,
    }
    return Forecast(
        settings=tuple(s.setting.label for s in servers),
        tok_s=tok_s,
        per_request_tok_s=tok_s / running if running else 0.0,
        queued=queued,
        value=values[objective],
        servers=tuple(out),
        class_speed={c: made[c] / n for c, n in held.items() if n > 0},
    )


def _mean(parts: Sequence[tuple[float, Forecast]]) -> Forecast:
    """The forecasts weighed together (weights summing to 1); each server's depth, the
    heaviest's; each class's speed, over the forecasts that run it."""
    heaviest = max(parts, key=lambda p: p[0])[1]

    def mean(get: Callable[[Forecast], float]) -> float:
        return sum(w * get(fc) for w, fc in parts)

    def server(i: int) -> ServerForecast:
        def at(get: Callable[[ServerForecast], float]) -> float:
            return sum(w * get(fc.servers[i]) for w, fc in parts)

        return msgspec.structs.replace(
            heaviest.servers[i], running=at(lambda s: s.running), tok_s=at(lambda s: s.tok_s),
            per_request_tok_s=at(lambda s: s.per_request_tok_s),
        )  # fmt: skip

    servers = tuple(server(i) for i in range(len(heaviest.servers)))
    speeds: dict[str, list[float]] = {}
    for w, fc in parts:
        for c, v in fc.class_speed.items():
            acc = speeds.setdefault(c, [0.0, 0.0])
            acc[0] += w * v
            acc[1] += w
    return msgspec.structs.replace(
        heaviest, tok_s=mean(lambda fc: fc.tok_s), queued=mean(lambda fc: fc.queued),
        per_request_tok_s=mean(lambda fc: fc.per_request_tok_s),
        value=mean(lambda fc: fc.value), servers=servers,
        class_speed={c: v / w for c, (v, w) in speeds.items() if w > 0},
    )  # fmt: skip


def forecast(
    settings: Sequence[Setting],
    users: Mapping[str, float],
    est: Estimates | Physics,
    objective: Objective = "throughput",
    floor_tok_s: float = 0.0,
) -> Forecast:
    """The steady state of `users` (closed-loop users per class) on servers at `settings`:
    placed as the policy would while slots are plenty, class-blind once they are all taken
    (a freed slot goes to the next request, whatever its class), in between from
    `SORTING_LIMIT` of the slots taken to all of them. Fractional users are the mean of the
    whole-user mixes that make them (`compositions`): two users of whom 1.6 are greedy are
    both greedy 60% of the time and one of each 40%, and a pool that sorts the classes
    yields the mean of the two, not two greedy users' rate."""
    phys = est if isinstance(est, Physics) else Physics(est)
    parts = []
    for weight, mix in compositions(users):
        key = (tuple(settings), tuple(sorted(mix.items())), objective, floor_tok_s)
        fc = phys.whole.get(key)
        if fc is None:
            fc = phys.whole[key] = _whole(settings, mix, phys, objective, floor_tok_s)
        parts.append((weight, fc))
    return parts[0][1] if len(parts) == 1 else _mean(parts)


def _whole(
    settings: Sequence[Setting],
    users: Mapping[str, int],
    phys: Physics,
    objective: Objective,
    floor_tok_s: float,
) -> Forecast:
    """`forecast` of whole users."""
    occupancy = sum(users.values()) / max(1, sum(phys.depths[s.deepest].capacity for s in settings))
    placed = blind = None
    if occupancy < 1.0:
        servers = [_Server(s, phys) for s in settings]
        queued = sum(1 for c in _order(users) if not _place(servers, c, objective, floor_tok_s))
        placed = _summary(servers, queued, objective, floor_tok_s)
    if occupancy > SORTING_LIMIT:
        servers = [_Server(s, phys) for s in settings]
        blind = _summary(servers, _blind(servers, users), objective, floor_tok_s)
    if placed is None or blind is None:
        result = placed or blind
        assert result is not None
        return result
    w = (occupancy - SORTING_LIMIT) / (1.0 - SORTING_LIMIT)
    return _mean([(1.0 - w, placed), (w, blind)])
