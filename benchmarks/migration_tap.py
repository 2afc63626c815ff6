"""What keeping a stream movable costs: the proxy's event relay (`EventFilter`) against the one
a request that may move is relayed through (`continued.Tap`, which holds each event for
`Migration` to read if the stream moves), on SGLang-shaped chat chunks, one event per feed as
a speculative stream delivers them: per event along one long stream, and per short stream
(its relay and its `Migration` made, `--stream-events` events fed).

    python benchmarks/migration_tap.py --events 200000 --stream-events 4
"""

from __future__ import annotations

import argparse
import time

from specroute.proxy.chunks import EventFilter
from specroute.proxy.continued import Tap
from specroute.proxy.fields import Extras
from specroute.proxy.migrate import Migration

CHUNK = (
    b'data: {"id":"0123456789abcdef0123456789abcdef","object":"chat.completion.chunk",'
    b'"created":1764626000,"model":"Qwen/Qwen3.5-122B-A10B","choices":[{"index":0,"delta":'
    b'{"reasoning_content":null,"content":" river mountain forest"},"logprobs":null,'
    b'"finish_reason":null,"matched_stop":null}]}\n\n'
)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def per_event_ns(relay: EventFilter, events: int) -> float:
    feed = relay.feed
    start = time.perf_counter()
    for _ in range(events):
        feed(CHUNK, 0.0)
    return (time.perf_counter() - start) / events * 1e9


def per_stream_ns(movable: bool, events: int, streams: int) -> float:
    """One short stream's relay, made and fed `events` events, `streams` times."""
    start = time.perf_counter()
    for _ in range(streams):
        if movable:
            relay: EventFilter = Tap(Migration("chat", BODY, 1), Extras(), 0.0)
        else:
            relay = EventFilter(Extras(), 0.0)
        feed = relay.feed
        for _ in range(events):
            feed(CHUNK, 0.0)
    return (time.perf_counter() - start) / streams * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stream-events", type=int, default=4)
    args = parser.parse_args()
    plain, tapped = [], []
    for _ in range(args.repeats):
        plain.append(per_event_ns(EventFilter(Extras(), 0.0), args.events))
        tapped.append(per_event_ns(Tap(Migration("chat", BODY, 1), Extras(), 0.0), args.events))
    best_plain, best_tap = min(plain), min(tapped)
    print(f"events per run: {args.events}, best of {args.repeats}")
    print(f"EventFilter.feed: {best_plain:8.0f} ns/event")
    print(f"Tap.feed:         {best_tap:8.0f} ns/event (+{best_tap - best_plain:.0f} ns)")
    k, streams = args.stream_events, max(1, args.events // max(1, args.stream_events))
    plain = [per_stream_ns(False, k, streams) for _ in range(args.repeats)]
    tapped = [per_stream_ns(True, k, streams) for _ in range(args.repeats)]
    best_plain, best_tap = min(plain), min(tapped)
    print(f"a stream of {k} events, relay made and fed, best of {args.repeats}:")
    print(f"EventFilter:      {best_plain:8.0f} ns/stream")
    print(f"Migration + Tap:  {best_tap:8.0f} ns/stream (+{best_tap - best_plain:.0f} ns)")


if __name__ == "__main__":
    main()
