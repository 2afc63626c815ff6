"""Every `specroute ...` command in a fenced block of README.md, docs/*.md and the results'
notes (benchmarks/results/**/*.md) parses with the real command line
(`specroute.cli.build_parser`), and every `benchmarks/NAME.py ...` command there with that
script's own parser, so the docs cannot name a flag, subcommand or value that
does not exist. Nothing is run: argparse only."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import inspect
import io
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import pytest

from specroute.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks" / "results").rglob("*.md")),
]
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
# `specroute` then a subcommand-like word: output such as "specroute demo: starting" is no command.
COMMAND_START = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?specroute\s+[a-z-][a-z-]*(?:\s|$)")
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")"}
REDIRECTIONS = {">", ">>", "<", ">&", "&>"}
SHELL_WORDS = {"do", "then", "else", "time", "exec", "nohup"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
LOOP = re.compile(r"\bfor\s+([A-Za-z_][A-Za-z0-9_]*)\s+in\s+([^;\n]+);")
SET = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_]*)=(\S+)[ \t]*$", re.MULTILINE)
BENCHMARK = re.compile(r"^(?:\./)?benchmarks/(\w+)\.py$")
RUNNERS = {"nice": 2, "timeout": 1, "env": 0}
"""Words that run the command after them, with how many arguments of their own they take
(`nice -n 5 python ...`, `timeout 600 python ...`)."""


def _logical_lines(block: str) -> list[tuple[int, str]]:
    """A block's lines with backslash continuations joined, each with its offset in the block."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(block.splitlines()):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines


def _values(block: str) -> dict[str, str]:
    """What a block's shell variables stand for: a loop's first word (`for pool in auto k3`),
    else what the block sets (`T=scenarios/x.toml`); any other variable stands for a number,
    as it does in the docs' loops."""
    values = dict(SET.findall(block))
    values.update((name, words.split()[0]) for name, words in LOOP.findall(block))
    return values


def _invocations(line: str, values: Mapping[str, str]) -> list[list[str]]:
    """The words of each command in one shell line: after `;`, `&&`, `do`, `VAR=value`..."""
    expanded = VARIABLE.sub(lambda m: values.get(m.group(1), "1"), line)
    lexer = shlex.shlex(expanded, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = [[]]
    redirected = False
    for token in lexer:
        if redirected:  # the file a redirection names is no argument
            redirected = False
        elif token in REDIRECTIONS:
            redirected = True
        elif token in SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    found = []
    for words in segments:
        while words and (words[0] in SHELL_WORDS or ASSIGNMENT.match(words[0])):
            words = words[1:]
        found.append(words)
    return found


def _commands_in(line: str, values: Mapping[str, str] | None = None) -> list[list[str]]:
    """The `specroute` argument lists in one shell line."""
    return [
        words[1:]
        for words in _invocations(line, values or {})
        if words and words[0].rsplit("/", 1)[-1] == "specroute"
    ]


def _script(words: list[str]) -> tuple[str, list[str]] | None:
    """(benchmark name, its arguments) where `words` run `benchmarks/NAME.py` (through
    `nice -n 5`, `timeout N`, a Python), else None."""
    while words and words[0] in RUNNERS:
        words = words[1 + RUNNERS[words[0]] :]
    if words and words[0].rsplit("/", 1)[-1].startswith("python"):
        words = words[1:]
    found = BENCHMARK.match(words[0]) if words else None
    return (found.group(1), words[1:]) if found else None


def doc_commands(text: str) -> list[tuple[int, list[str]]]:
    """Each fenced `specroute` command in a Markdown text, with its line number (from 1)."""
    commands = []
    for fence in FENCE.finditer(text):
        first_line = text.count("\n", 0, fence.start(1)) + 1
        values = _values(fence.group(1))
        for offset, line in _logical_lines(fence.group(1)):
            if COMMAND_START.search(line):
                commands += [(first_line + offset, argv) for argv in _commands_in(line, values)]
    return commands


def doc_benchmarks(text: str) -> list[tuple[int, str, list[str]]]:
    """Each fenced `benchmarks/NAME.py` command in a Markdown text: its line, NAME, arguments."""
    commands = []
    for fence in FENCE.finditer(text):
        first_line = text.count("\n", 0, fence.start(1)) + 1
        values = _values(fence.group(1))
        for offset, line in _logical_lines(fence.group(1)):
            if "benchmarks/" not in line:
                continue
            found = (_script(words) for words in _invocations(line, values))
            commands += [(first_line + offset, *f) for f in found if f is not None]
    return commands


def _strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser and its subparsers without abbreviations: a doc spells every flag in full."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)
    return parser


def parse_error(argv: list[str]) -> str | None:
    """argparse's complaint about `specroute ARGV`, or None when it parses (`--help` included)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            _strict(build_parser()).parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip() or f"exit status {exc.code}"
    return None


class _Parsed(Exception):
    """Raised once a script's parser has accepted its arguments: nothing after it runs."""


def _benchmark(name: str) -> ModuleType:
    """`benchmarks/NAME.py` imported as a module (its siblings importable, as when run)."""
    key = f"_doc_benchmark_{name}"
    if key in sys.modules:
        return sys.modules[key]
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def benchmark_parse_error(
    name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> str | None:
    """argparse's complaint about `python benchmarks/NAME.py ARGV`, or None when it parses:
    the script's `main` runs until its parser has taken the arguments, and stops there. A
    script without argparse takes no arguments."""
    path = ROOT / "benchmarks" / f"{name}.py"
    if not path.exists():
        return f"benchmarks/{name}.py does not exist"
    if "argparse" not in path.read_text():
        return None if not argv else f"benchmarks/{name}.py takes no arguments"
    try:
        module = _benchmark(name)
    except ModuleNotFoundError as exc:  # the GPU benchmarks' torch is no dev dependency
        pytest.skip(f"benchmarks/{name}.py needs {exc.name}, which `make install` leaves out")
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parse(self, *args, **kwargs)  # type: ignore[arg-type]
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            result = module.main()
            if inspect.iscoroutine(result):
                asyncio.run(result)
        except _Parsed:
            return None
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip() or f"exit status {exc.code}"
            return None
    return f"benchmarks/{name}.py's main returned without parsing its arguments"


def _all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for line, argv in doc_commands(path.read_text()):
            found.append((f"{path.relative_to(ROOT)}:{line}", argv))
    return found


COMMANDS = _all_commands()
BENCHMARKS = [
    (f"{path.relative_to(ROOT)}:{line}", name, argv)
    for path in DOCS
    for line, name, argv in doc_benchmarks(path.read_text())
]


def test_the_docs_show_commands_for_every_part() -> None:
    subcommands = {argv[0] for _, argv in COMMANDS if argv}
    assert {"demo", "serve", "launch", "bench", "emulate", "policies", "config"} <= subcommands


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_each_documented_command_parses(where: str, argv: list[str]) -> None:
    error = parse_error(argv)
    assert error is None, f"{where}: specroute {shlex.join(argv)}\n{error}"


@pytest.mark.parametrize(
    ("where", "name", "argv"), BENCHMARKS, ids=[where for where, _, _ in BENCHMARKS]
)
def test_each_documented_benchmark_command_parses(
    where: str, name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    error = benchmark_parse_error(name, argv, monkeypatch)
    assert error is None, f"{where}: benchmarks/{name}.py {shlex.join(argv)}\n{error}"


def test_a_benchmark_command_s_made_up_flag_or_choice_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (
        "```sh\nT=scenarios/depth-ramp.toml\nfor pool in auto k9; do\n"
        "  nice -n 5 .venv/bin/python benchmarks/depth_sim.py --trace $T --pool $pool\n"
        "done\n.venv/bin/python benchmarks/depth_sim.py --trace $T --pool k3 --poool k2\n"
        "timeout 60 python benchmarks/depth_simm.py\n```\n"
    )
    commands = doc_benchmarks(text)
    assert commands == [
        (4, "depth_sim", ["--trace", "scenarios/depth-ramp.toml", "--pool", "auto"]),
        (6, "depth_sim", ["--trace", "scenarios/depth-ramp.toml", "--pool", "k3", "--poool", "k2"]),
        (7, "depth_simm", []),
    ]
    assert benchmark_parse_error("depth_sim", commands[0][2], monkeypatch) is None
    assert "invalid choice: 'k9'" in (
        benchmark_parse_error("depth_sim", ["--pool", "k9"], monkeypatch) or ""
    )
    assert "unrecognized arguments: --poool" in (
        benchmark_parse_error("depth_sim", commands[1][2], monkeypatch) or ""
    )
    assert "does not exist" in (benchmark_parse_error("depth_simm", [], monkeypatch) or "")


def test_a_made_up_flag_or_subcommand_is_caught() -> None:
    text = (
        "Start it:\n\n  ```sh\nMODEL=/m specroute launch --steps 1,2 --emulate \\\n"
        "    --max-running-request 20\nfor k in 1 2; do specroute emulate --steps $k & done\n"
        "specroute servee --port 1 > out.txt\n```\n\n"
        "```\nspecroute demo: starting three servers\n```\n"
    )
    commands = doc_commands(text)
    assert [(line, argv[0]) for line, argv in commands] == [
        (4, "launch"),
        (6, "emulate"),
        (7, "servee"),
    ]
    launch, emulate, typo = (argv for _, argv in commands)
    assert "unrecognized arguments: --max-running-request" in (parse_error(launch) or "")
    assert parse_error(emulate) is None
    assert typo == ["servee", "--port", "1"]  # the redirection is the shell's
    assert "invalid choice: 'servee'" in (parse_error(typo) or "")
