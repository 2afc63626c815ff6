"""The price of splitting a pool's slots among N proxy replicas, exactly, for closed-loop users:
what no router can win back while the replicas never over-admit and share no counter.

    .venv/bin/python benchmarks/split_bound.py                       # the seed 1/2/3 pool
    .venv/bin/python benchmarks/split_bound.py --capacity 47 39 32   # costly-drafts' pool

Each replica may fill only its share of every backend's slots (`split = "capacity"`, slot by
slot by rank: `specroute.pool.load.share_of`, offsets as the routing index draws them), so a
replica is a station of as many servers as its shares add up to. `users` closed-loop users with
no think time send each request to a replica drawn at random (a Kubernetes Service): that is a
closed network of N multi-server stations with equal visit ratios, whose stationary law has
product form (exact for exponential request times, a close guide for others). Its busy slots,
against one proxy's `min(users, capacity)`, are the split's throughput ratio:

    P(n_1..n_N) ~ prod_r g_r(n_r),   g_r(n) = 1 / prod_{i<=n} min(i, c_r)   (Buzen)

The marginal of each replica follows by convolving the others; exact rational arithmetic.

Request times less variable than exponential cost less: `--cv` (the coefficient of variation of
a request's time; 0.42 in the seed's saturated phase, 0.51 on costly-drafts, from the replicas
benchmark's records) adds a row per replica count from an event simulation with gamma times of
that variation (its cv = 1 row checks the simulation against the exact figure).

Idle slots cost less in tok/s than in slots, since a fuller batch runs each iteration slower.
`--profile` turns the split into tok/s on an emulator profile, phase by phase over a trace
(default `scenarios/policy-eval.toml`, as `benchmarks/replicas.py` runs it): one backend per
depth of `--depths`, each request of the phase's mix (its class, a log-normal length as the
emulator draws it, capped at max_tokens) sent to a random replica, which puts it on the backend
its share has room on where the request runs fastest (the same rule for one proxy), and every
running request gaining E_k of its class per iteration of T(batch, k). Phases weigh by their
duration (times `--scale`, 10, for steady figures); what one phase leaves running carries on.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import zlib
from collections import deque
from fractions import Fraction
from pathlib import Path
from typing import Any

from specroute.bench.trace import load_scenario
from specroute.emulator.profiles import Profile, get_profile, sampling_class
from specroute.pool.load import Share, share_of

ROOT = Path(__file__).resolve().parent.parent
SEED_CAPACITY = (26, 21, 17)
"""The seed profile's 1/2/3 pool: R(k) = floor(106 / (k + 3)) slots."""


def shares(capacity: tuple[int, ...], replicas: int, names: tuple[str, ...]) -> list[int]:
    """Each replica's slots over every backend, as the routing index splits them."""
    return [
        sum(
            share_of(c, Share(replicas, rank), zlib.crc32(name.encode()))
            for c, name in zip(capacity, names, strict=True)
        )
        for rank in range(replicas)
    ]


def _weights(slots: int, users: int) -> list[Fraction]:
    out, w = [Fraction(1)], Fraction(1)
    for n in range(1, users + 1):
        w /= min(n, slots)
        out.append(w)
    return out


def _convolve(a: list[Fraction], b: list[Fraction], users: int) -> list[Fraction]:
    return [sum((a[i] * b[n - i] for i in range(n + 1)), Fraction(0)) for n in range(users + 1)]


def busy_slots(stations: list[int], users: int) -> Fraction:
    """Expected busy slots of the closed network: sum over replicas of E[min(n_r, c_r)]."""
    weights = [_weights(c, users) for c in stations]
    total = Fraction(0)
    norm: Fraction | None = None
    for r, c in enumerate(stations):
        rest = [Fraction(1)] + [Fraction(0)] * users
        for q, w in enumerate(weights):
            if q != r:
                rest = _convolve(rest, w, users)
        joint = [weights[r][n] * rest[users - n] for n in range(users + 1)]
        norm = sum(joint, Fraction(0)) if norm is None else norm
        total += sum((min(n, c) * p for n, p in enumerate(joint)), Fraction(0)) / norm
    return total


def simulated(stations: list[int], users: int, cv: float, requests: int, seed: int = 0) -> float:
    """Mean busy slots over `requests` requests of mean time 1 (gamma, variation `cv`) after a
    tenth as many of warm-up: each request to a replica at random, queued there while its
    slots are full, the user's next request sent as it ends."""
    rng = random.Random(seed)
    shape = 1 / (cv * cv)

    def duration() -> float:
        return rng.gammavariate(shape, 1 / shape)

    busy = [0] * len(stations)
    queues: list[deque[int]] = [deque() for _ in stations]
    ends: list[tuple[float, int]] = []  # (time, replica)
    now, area, measured_from, done = 0.0, 0.0, None, 0

    def send(at: float) -> None:
        r = rng.randrange(len(stations))
        if busy[r] < stations[r]:
            busy[r] += 1
            heapq.heappush(ends, (at + duration(), r))
        else:
            queues[r].append(0)

    for _ in range(users):
        send(0.0)
    warm = requests // 10
    while done < warm + requests:
        at, r = heapq.heappop(ends)
        if measured_from is not None:
            area += sum(busy) * (at - now)
        now = at
        done += 1
        if done == warm:
            measured_from = now
        busy[r] -= 1
        if queues[r]:
            queues[r].popleft()
            busy[r] += 1
            heapq.heappush(ends, (now + duration(), r))
        send(now)
    assert measured_from is not None
    return area / (now - measured_from)


class TokenPool:
    """Backends (one per depth) and the replicas' shares of their slots, in tokens and seconds:
    each running request gains E_k of its class per iteration of T(batch, k)."""

    def __init__(self, profile: Profile, depths: tuple[int, ...], replicas: int, seed: int):
        self.profile, self.depths = profile, depths
        self.capacity = [profile.capacity(k) for k in depths]
        names = [f"b{i}" for i in range(len(depths))]
        self.share = [[share_of(c, Share(replicas, r), zlib.crc32(n.encode()))
                       for c, n in zip(self.capacity, names, strict=True)]
                      for r in range(replicas)]  # fmt: skip
        self.mine = [[0] * len(depths) for _ in range(replicas)]
        self.running: list[list[list[Any]]] = [[] for _ in depths]  # [left tokens, class, replica]
        self.waiting: list[deque[tuple[float, str]]] = [deque() for _ in range(replicas)]
        self.rng = random.Random(seed)
        self.now, self.tokens = 0.0, 0.0

    def _rate(self, b: int, klass: str, batch: int) -> float:
        k = self.depths[b]
        return self.profile.expected_tokens(klass, k) / self.profile.iteration_time(batch, k)

    def _place(self, r: int, length: float, klass: str) -> bool:
        room = [b for b in range(len(self.depths)) if self.mine[r][b] < self.share[r][b]]
        if not room:
            return False
        b = max(room, key=lambda b: self._rate(b, klass, len(self.running[b]) + 1))
        self.mine[r][b] += 1
        self.running[b].append([length, klass, r])
        return True

    def send(self, mix: list[tuple[float, str, int]]) -> None:
        _, klass, cap = self.rng.choices(mix, weights=[m[0] for m in mix])[0]
        sigma = 0.6
        mu = math.log(self.profile.mean_output_tokens) - sigma * sigma / 2
        length = float(min(cap, max(1, round(self.rng.lognormvariate(mu, sigma)))))
        r = self.rng.randrange(len(self.share))
        if not self._place(r, length, klass):
            self.waiting[r].append((length, klass))

    def run(self, until: float, mix: list[tuple[float, str, int]]) -> None:
        """Advance to `until`, each finished request's user sending its next at once."""
        while True:
            rates = [[self._rate(b, q[1], len(run)) for q in run]
                     for b, run in enumerate(self.running)]  # fmt: skip
            step = min((q[0] / v for run, vs in zip(self.running, rates, strict=True)
                        for q, v in zip(run, vs, strict=True)), default=math.inf)  # fmt: skip
            dt = min(step, until - self.now)
            for run, vs in zip(self.running, rates, strict=True):
                for q, v in zip(run, vs, strict=True):
                    q[0] -= v * dt
                    self.tokens += v * dt
            self.now += dt
            if self.now >= until:
                return
            for b, run in enumerate(self.running):
                for q in [q for q in run if q[0] <= 1e-9]:
                    run.remove(q)
                    r = q[2]
                    self.mine[r][b] -= 1
                    if self.waiting[r]:
                        self._place(r, *self.waiting[r].popleft())
                    self.send(mix)


def trace_tokens(profile: Profile, depths: tuple[int, ...], replicas: int, trace: Path,
                 seed: int, scale: float) -> list[tuple[str, float]]:  # fmt: skip
    """(phase, tok/s) over the trace's phases (durations times `scale`), its users closed-loop
    with no think time."""
    scenario = load_scenario(trace)
    pool = TokenPool(profile, depths, replicas, seed)
    users, out = 0, []
    for phase in scenario.phases:
        mix = [(m.weight, sampling_class(m.temperature), m.max_tokens or 384)
               for m in (phase.mix or scenario.mix)]  # fmt: skip
        while users < phase.concurrency:  # more users: they start; fewer: the extra leave
            users += 1
            pool.send(mix)
        start, before = pool.now, pool.tokens
        if users > phase.concurrency:
            _retire(pool, users - phase.concurrency)
            users = phase.concurrency
        pool.run(start + phase.duration * scale, mix)
        out.append((phase.name, (pool.tokens - before) / (phase.duration * scale)))
    return out


def _retire(pool: TokenPool, extra: int) -> None:
    """Users leaving: their waiting requests first, then running ones (as if they ended)."""
    for queue in pool.waiting:
        while queue and extra:
            queue.pop()
            extra -= 1
    for b, run in enumerate(pool.running):
        while run and extra:
            q = run.pop()
            pool.mine[q[2]][b] -= 1
            extra -= 1


def token_table(profile_name: str, depths: tuple[int, ...], replicas: list[int], trace: Path,
                seeds: int, scale: float) -> None:  # fmt: skip
    profile = get_profile(profile_name)
    rows = {}
    for n in replicas:
        runs = [trace_tokens(profile, depths, n, trace, seed, scale) for seed in range(seeds)]
        rows[n] = [
            (name, sum(r[i][1] for r in runs) / seeds) for i, (name, _) in enumerate(runs[0])
        ]
    scenario = load_scenario(trace)
    spans = [p.duration for p in scenario.phases]

    def whole(cells: list[tuple[str, float]]) -> float:
        return sum(v * d for (_, v), d in zip(cells, spans, strict=True)) / sum(spans)

    base = rows[replicas[0]]
    slots = "/".join(str(profile.capacity(k)) for k in depths)
    print(f"\n{profile_name}, depths {'/'.join(map(str, depths))} (slots {slots}), "
          f"{trace.name}, phases x{scale:g}, mean of {seeds} seeds: tok/s against "
          f"{replicas[0]} replica(s)")  # fmt: skip
    print(f"| replicas | whole trace | {' | '.join(n for n, _ in base)} |")
    print("|---|---|" + "---|" * len(base))
    for n, cells in rows.items():
        text = " | ".join(
            f"{v:.0f} ({v / b - 1:+.1%})" for (_, v), (_, b) in zip(cells, base, strict=True)
        )
        print(f"| {n} | {whole(cells):.0f} ({whole(cells) / whole(base) - 1:+.1%}) | {text} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, nargs="+", default=list(SEED_CAPACITY),
                        help="each backend's slots (default: the seed 1/2/3)")  # fmt: skip
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3, 6])
    parser.add_argument("--users", type=int, nargs="+", default=[32, 48, 56, 64, 72, 96])
    parser.add_argument("--names", nargs="+", help="backend names (their slot offsets)")
    parser.add_argument(
        "--cv",
        type=float,
        nargs="*",
        default=[],
        help="also simulate request times of this variation (e.g. 1 0.42)",
    )
    parser.add_argument("--requests", type=int, default=200_000, help="per simulated cell")
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        help="also the tok/s over a trace on this emulator profile",
    )
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--trace", type=Path, default=ROOT / "scenarios" / "policy-eval.toml")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--scale",
        type=float,
        default=10.0,
        help="phase durations times this, for steady figures (default 10)",
    )
    args = parser.parse_args()
    capacity = tuple(args.capacity)
    names = tuple(args.names or (f"b{i}" for i in range(len(capacity))))
    whole = sum(capacity)
    print(f"capacity {'+'.join(map(str, capacity))} = {whole} slots; throughput with N replicas "
          "against one proxy (busy slots / min(users, capacity))")  # fmt: skip
    head = " | ".join(f"{u} users" for u in args.users)
    print(f"| replicas | slots per replica | {head} |")
    print("|---|---|" + "---|" * len(args.users))
    for n in args.replicas:
        stations = shares(capacity, n, names)
        cells = []
        for users in args.users:
            ratio = float(busy_slots(stations, users)) / min(users, whole)
            cells.append(f"{ratio - 1:+.1%}")
        print(f"| {n} | {'/'.join(map(str, stations))} | {' | '.join(cells)} |")
        for cv in args.cv:
            sims = [simulated(stations, u, cv, args.requests) / min(u, whole) for u in args.users]
            text = " | ".join(f"{r - 1:+.1%}" for r in sims)
            print(f"| {n}, simulated, cv {cv:g} | | {text} |")
    for name in args.profile:
        token_table(name, tuple(args.depths), args.replicas, args.trace, args.seeds, args.scale)


if __name__ == "__main__":
    main()
