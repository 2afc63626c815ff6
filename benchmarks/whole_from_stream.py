"""Why a non-streamed request moves by being resent (`proxy/resend.py`): what the proxy would
spend per request to assemble a non-streamed reply from a stream it asked for instead (the
relay a movable stream goes through, `continued.Tap`, over each event, then the text joined),
against what it spends on the whole body today (`chunks.strip_reply`), and what resending
adds to each request that may move (`resend.DrainWatch`, around its wait).
SGLang-shaped chat events, `--tokens-per-event` tokens each as a speculative server sends them.

    python benchmarks/whole_from_stream.py --tokens 1024 --tokens-per-event 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from specroute.cmdline import int_list
from specroute.pool import Holds
from specroute.proxy.chunks import ReplyMeter, strip_reply
from specroute.proxy.continued import Tap
from specroute.proxy.fields import Extras
from specroute.proxy.migrate import Migration
from specroute.proxy.resend import DrainWatch

REQUEST = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
ENVELOPE = {"id": "0123456789abcdef0123456789abcdef", "created": 1764626000,
            "model": "Qwen/Qwen3.5-122B-A10B"}  # fmt: skip
WORD = " river"  # one token


def stream_events(tokens: int, per_event: int) -> list[bytes]:
    """The chat stream of a `tokens`-token answer, `per_event` tokens an event."""
    events = []
    for start in range(0, tokens, per_event):
        text = WORD * min(per_event, tokens - start)
        delta = {"reasoning_content": None, "content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                  "matched_stop": None}  # fmt: skip
        chunk = {**ENVELOPE, "object": "chat.completion.chunk", "choices": [choice]}
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


def whole_body(tokens: int) -> bytes:
    """The same answer as SGLang's non-streamed reply."""
    message = {"role": "assistant", "content": WORD * tokens, "reasoning_content": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length",
              "matched_stop": None}  # fmt: skip
    usage = {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": tokens + 9}
    body = {**ENVELOPE, "object": "chat.completion", "choices": [choice], "usage": usage,
            "metadata": {"weight_version": "default"}}  # fmt: skip
    return json.dumps(body).encode()


def assembled_us(events: list[bytes], repeats: int) -> float:
    """Per request: each event through the movable stream's relay, then the text joined."""
    start = time.perf_counter()
    for _ in range(repeats):
        migration = Migration("chat", REQUEST, 1)
        feed = Tap(migration, Extras(), 0.0).feed
        for event in events:
            feed(event, 0.0)
        migration.text  # noqa: B018 - the assembled text is the point
    return (time.perf_counter() - start) / repeats * 1e6


def whole_us(body: bytes, repeats: int) -> float:
    """Per request: the whole body as the relay handles it today."""
    extras = Extras()
    start = time.perf_counter()
    for _ in range(repeats):
        strip_reply(body, extras, ReplyMeter(), True)
    return (time.perf_counter() - start) / repeats * 1e6


async def _answered() -> bytes:
    return b""


async def _watched_us(repeats: int, watched: bool) -> float:
    watch = DrainWatch(Holds(), 2.0)
    start = time.perf_counter()
    for _ in range(repeats):
        if watched:
            await watch.wait(_answered(), "a")
        else:
            await _answered()
    return (time.perf_counter() - start) / repeats * 1e6


def watch_us(repeats: int) -> float:
    """Per request: what the drain watch adds to a wait on a backend that is not draining."""
    bare = asyncio.run(_watched_us(repeats, False))
    return asyncio.run(_watched_us(repeats, True)) - bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="tokens in the answer")
    parser.add_argument("--tokens-per-event", type=int_list, default=(1, 4))
    parser.add_argument("--repeats", type=int, default=200, help="requests per measurement")
    parser.add_argument("--best-of", type=int, default=5)
    args = parser.parse_args()
    body = whole_body(args.tokens)
    whole = min(whole_us(body, args.repeats) for _ in range(args.best_of))
    print(f"{args.tokens}-token chat answer, best of {args.best_of} x {args.repeats} requests")
    print(f"whole body (today, and a resend):        {whole:9.1f} us/request")
    for per_event in args.tokens_per_event:
        events = stream_events(args.tokens, per_event)
        built = min(assembled_us(events, args.repeats) for _ in range(args.best_of))
        label = f"assembled from {len(events) - 1} events ({per_event}/event):"
        print(f"{label:40s} {built:9.1f} us/request (+{built - whole:.1f})")
    watch = min(watch_us(args.repeats * 50) for _ in range(args.best_of))
    print(f"resend's drain watch:                    +{watch:8.1f} us/request")


if __name__ == "__main__":
    main()
