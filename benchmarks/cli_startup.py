"""How long `specroute` takes to start: `--version`, `emulate --help`, `serve --help` and
`bench --help`, each run N times in a fresh interpreter, median and max printed. Every emulator a
test or the launcher spawns pays the `emulate` figure.

    .venv/bin/python benchmarks/cli_startup.py               # this checkout
    .venv/bin/python benchmarks/cli_startup.py --tree /tmp/base  # another checkout, same venv
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = (["--version"], ["emulate", "--help"], ["serve", "--help"], ["bench", "--help"])


def _time(argv: list[str], tree: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(  # `-m` puts the working directory first on sys.path: run from the tree
        [sys.executable, "-m", "specroute", *argv],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command (default: 7)")
    parser.add_argument(
        "--tree", type=Path, default=Path(__file__).resolve().parent.parent,
        help="the checkout whose specroute package is timed (default: this one)",
    )  # fmt: skip
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve())}
    print(f"specroute start-up from {args.tree} ({args.runs} runs each)")
    print(f"  {'command':24} {'median s':>9} {'max s':>7}")
    for argv in COMMANDS:
        times = [_time(argv, args.tree, env) for _ in range(args.runs)]
        print(f"  {' '.join(argv):24} {statistics.median(times):9.3f} {max(times):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
