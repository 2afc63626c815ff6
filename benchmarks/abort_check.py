"""What spotting a backend's finish_reason "abort" costs the stream relay: `EventFilter.feed`
per SGLang-shaped content event with the check (`proxy.aborts.aborted`: a bytes search, a
parse only on a hit) against the same relay with the check made a no-op, interleaved runs,
best of `--repeats`; and the check alone on a content event and on an abort event.

    python benchmarks/abort_check.py --events 200000 --repeats 7
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable

from migration_tap import CHUNK

import specroute.proxy.chunks as chunks
from specroute.proxy.aborts import aborted
from specroute.proxy.fields import Extras

PAYLOAD = CHUNK.removeprefix(b"data: ").rstrip()
ABORT = PAYLOAD.replace(b'"finish_reason":null', b'"finish_reason":"abort"')


def per_event_ns(events: int) -> float:
    feed = chunks.EventFilter(Extras(), 0.0).feed
    start = time.perf_counter()
    for _ in range(events):
        feed(CHUNK, 0.0)
    return (time.perf_counter() - start) / events * 1e9


def call_ns(call: Callable[[], object], number: int, repeats: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeats)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    checked, unchecked = [], []
    try:
        for _ in range(args.repeats):
            chunks.aborted = aborted
            checked.append(per_event_ns(args.events))
            chunks.aborted = lambda payload: False
            unchecked.append(per_event_ns(args.events))
    finally:
        chunks.aborted = aborted
    best, bare = min(checked), min(unchecked)
    print(f"events per run: {args.events}, best of {args.repeats}")
    print(f"EventFilter.feed, abort check:   {best:8.0f} ns/event")
    print(f"EventFilter.feed, check a no-op: {bare:8.0f} ns/event ({best - bare:+.0f} ns)")
    base = call_ns(lambda: None, args.events, args.repeats)
    miss = call_ns(lambda: aborted(PAYLOAD), args.events, args.repeats) - base
    hit = call_ns(lambda: aborted(ABORT), args.events, args.repeats) - base
    print(f"aborted() on a content event: {miss:6.0f} ns (a bytes search)")
    print(f"aborted() on an abort event:  {hit:6.0f} ns (searched and parsed)")


if __name__ == "__main__":
    main()
