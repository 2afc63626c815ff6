"""Each backend's and class's requests in a window of a proxy log (its `request_finished`
lines): how many, their tokens, each one's tok/s and first-token wait, and their time in
flight. `benchmarks/live_reconfigure.py` writes the log of each pool's proxy under
`OUT/POOL/logs/proxy.log`.

    python benchmarks/proxy_log_split.py \\
        benchmarks/results/live-reconfigure-14/auto/logs/proxy.log \\
        2026-12-05T02:19:40Z 2026-12-05T02:22:19Z
"""

from __future__ import annotations

import json
import sys
from datetime import datetime


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> None:
    log, start, end = sys.argv[1], _ts(sys.argv[2]), _ts(sys.argv[3])
    by: dict[tuple[str, str], tuple[int, int, float, float]] = {}
    with open(log) as lines:
        for line in lines:
            if '"request_finished"' not in line:
                continue
            r = json.loads(line)
            stop = _ts(r["timestamp"])
            if start <= stop - r["duration_s"] and stop <= end:
                key = (r["backend"], r["workload_class"].rsplit(":", 1)[1])
                n, tok, dur, ttft = by.get(key, (0, 0, 0.0, 0.0))
                by[key] = (n + 1, tok + r["completion_tokens"], dur + r["duration_s"],
                           ttft + r["ttft_s"])  # fmt: skip
    for (backend, klass), (n, tok, dur, ttft) in sorted(by.items()):
        print(f"{backend} {klass}: {n} requests, {tok} tokens, {tok / dur:.1f} tok/s each, "
              f"first token {ttft / n:.3f} s, {dur:.0f} s in flight")  # fmt: skip


if __name__ == "__main__":
    main()
