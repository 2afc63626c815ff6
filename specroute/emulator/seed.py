"""The published figures of the measurement that started specroute (the seed table).

Qwen3.5-122B-A10B with MTP on 4x RTX PRO 6000, greedy, `ignore_eos`, fixed output length.
Only these points were published; the emulator's default profile is calibrated to them.
"""

from __future__ import annotations

__all__ = [
    "SEED_AGGREGATE_TOK_S",
    "SEED_MAX_RUNNING_REQUESTS",
    "SEED_PER_REQUEST_TOK_S",
    "SEED_TOLERANCE",
]

SEED_PER_REQUEST_TOK_S: dict[tuple[int, int], float] = {
    # (steps, concurrency): tok/s of one request
    (1, 1): 123.0,
    (2, 1): 186.0,
    (3, 1): 234.0,
    (1, 64): 66.0,
    (3, 64): 120.0,
}
SEED_AGGREGATE_TOK_S: dict[tuple[int, int], float] = {
    (1, 64): 1582.0,
    (3, 64): 1914.0,
}
SEED_MAX_RUNNING_REQUESTS: dict[int, int] = {1: 26, 2: 21, 3: 17}
SEED_TOLERANCE = 0.07
"""How close an emulated measurement of the seed's workload must land to each published point."""
