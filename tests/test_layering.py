"""Dependencies point one way: the import graph of `specroute`, read with `ast` from the source
(module-level, function-level and type-only imports alike), against the allowed edges below."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specroute"

ALLOWED: dict[str, frozenset[str]] = {
    "proxy": frozenset({"pool", "policies"}),
    "pool": frozenset({"policies"}),
    # The launcher starts processes; `--reconfigure` hands the depth loop a restart function.
    # It reads the prior (pool) and checks the policy's pinned depth (policies).
    "launch": frozenset({"pool", "policies", "planner", "reconfigure"}),
    # The depth loop: readings of /pool, the planner, the actuator. Never `launch`.
    "reconfigure": frozenset({"planner", "policies"}),
    # `specroute tune` launches each depth, drives it with the bench's sweep and, for --emulate,
    # reads the emulator's seed figures.
    # `make vllm-check` (tune.vllm_matrix) builds restart lines too, from a planner Setting.
    "tune": frozenset({"launch", "bench", "emulator", "planner"}),
    "policies": frozenset(),
    "planner": frozenset({"policies"}),
    "bench": frozenset(),
    "emulator": frozenset(),
}
"""Each part and the other parts it may import, leaves aside: the design's direction."""

LEAVES = frozenset(
    {
        "specroute",  # the package itself: only __version__
        "cmdline",  # the usage error and the comma-separated integer parser every command uses
        "speculation",
        "errors",
        "config",
        "logs",
        "sse",
        "children",
        "looplag",
        "tasks",
        "prometheus",
        "profile_format",  # the profile file that bench and tune write and the pool reads
        "recommend",  # what a profile recommends: tune reports it, launch starts it
        "exposure",  # loopback or not, and the keyless-proxy warning (serve, launch)
        "helpformat",  # the command line's help formatter
        "raw_path",  # a path parameter that may hold `//`, for the proxy and the emulator
        "plotting",  # matplotlib for the PNG writers (bench, tune), or what to install
        "structdoc",  # field docstrings and type words for help and the example config
        "lanes",  # a request's latency lane: its config and the rule that picks it
        "batch_limit",  # a vLLM server's batch limit read from its scrapes (the pool)
        "wire",  # the admin contract (/pool, /plan, holds) that the proxy and the loop decode
    }
)
"""Modules anyone may import: no I/O of their own, and they import only other leaves."""

ENTRIES = frozenset({"__main__", "cli", "demo", "calibrate"})
"""Commands that assemble the parts (the demo and calibration spawn emulated servers); only
other commands import them."""

Edge = tuple[str, str, str, int]  # importer part, imported part, file, line


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _part(module: str) -> str:
    """`specroute.pool.h1` -> `pool`; `specroute.sse` -> `sse`; `specroute` -> `specroute`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, path: Path, known: set[str]
) -> Iterator[str]:
    """The `specroute` modules one import statement names (`from pkg import submodule` counts
    as the submodule)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    for alias in node.names:
        full = f"{base}.{alias.name}"
        yield full if full in known else base


def _edges(modules: dict[str, Path]) -> Iterator[Edge]:
    known = set(modules)
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, path, known):
                if name == "specroute" or name.startswith("specroute."):
                    source, target = _part(module), _part(name)
                    if source != target:
                        yield source, target, str(path.relative_to(PACKAGE.parent)), node.lineno


def _allowed(source: str, target: str) -> bool:
    if target in ENTRIES:
        return source in ENTRIES
    if target in LEAVES:
        return True
    if source in LEAVES:
        return False  # a leaf importing a part is no leaf
    return source in ENTRIES or target in ALLOWED.get(source, frozenset())


def test_every_part_of_the_package_is_placed_in_the_layering() -> None:
    parts = {_part(m) for m in _modules()}
    unplaced = parts - set(ALLOWED) - LEAVES - ENTRIES
    assert not unplaced, f"place {sorted(unplaced)} in tests/test_layering.py's ALLOWED or LEAVES"


def test_dependencies_point_one_way() -> None:
    back = [
        f"{file}:{line}: {source} imports {target}"
        for source, target, file, line in _edges(_modules())
        if not _allowed(source, target)
    ]
    assert not back, "imports against the layering:\n" + "\n".join(back)


def test_speculation_maths_is_stdlib_only() -> None:
    path = PACKAGE / "speculation.py"
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}


@pytest.mark.parametrize(
    ("source", "target"),
    [("policies", "pool"), ("pool", "proxy"), ("pool", "launch"), ("bench", "policies"),
     ("emulator", "pool"), ("policies", "emulator"), ("sse", "proxy"), ("bench", "cli")],
)  # fmt: skip
def test_back_edges_are_refused(source: str, target: str) -> None:
    assert not _allowed(source, target)


def _module_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the `specroute` modules it imports, anywhere in its body (a function-level import
    hides a cycle from Python at import time, not from this graph)."""
    known = set(modules)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[module] |= {n for n in _imported(node, module, path, known) if n in known}
        graph[module].discard(module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycle_between_modules() -> None:
    cycles = _cycles(_module_graph(_modules()))
    assert not cycles, "modules that import each other (directly or round a loop):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_check_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
