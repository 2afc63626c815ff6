"""Every `specroute ...` command in a fenced block of README.md and docs/*.md parses with the
real command line (`specroute.cli.build_parser`), so the docs cannot name a flag, subcommand or
value that does not exist. Nothing is run: argparse only."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from specroute.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
# `specroute` then a subcommand-like word: output such as "specroute demo: starting" is no command.
COMMAND_START = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?specroute\s+[a-z-][a-z-]*(?:\s|$)")
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")"}
REDIRECTIONS = {">", ">>", "<", ">&", "&>"}
SHELL_WORDS = {"do", "then", "else", "time", "exec", "nohup"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


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


def _commands_in(line: str) -> list[list[str]]:
    """The `specroute` argument lists in one shell line: after `;`, `&&`, `do`, `VAR=value`...
    Shell variables (`$k`) stand for a number, as they do in the docs' loops."""
    lexer = shlex.shlex(VARIABLE.sub("1", line), posix=True, punctuation_chars=";&|()<>")
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
        if words and words[0].rsplit("/", 1)[-1] == "specroute":
            found.append(words[1:])
    return found


def doc_commands(text: str) -> list[tuple[int, list[str]]]:
    """Each fenced `specroute` command in a Markdown text, with its line number (from 1)."""
    commands = []
    for fence in FENCE.finditer(text):
        first_line = text.count("\n", 0, fence.start(1)) + 1
        for offset, line in _logical_lines(fence.group(1)):
            if COMMAND_START.search(line):
                commands += [(first_line + offset, argv) for argv in _commands_in(line)]
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


def _all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for line, argv in doc_commands(path.read_text()):
            found.append((f"{path.relative_to(ROOT)}:{line}", argv))
    return found


COMMANDS = _all_commands()


def test_the_docs_show_commands_for_every_part() -> None:
    subcommands = {argv[0] for _, argv in COMMANDS if argv}
    assert {"demo", "serve", "launch", "bench", "emulate", "policies", "config"} <= subcommands


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_each_documented_command_parses(where: str, argv: list[str]) -> None:
    error = parse_error(argv)
    assert error is None, f"{where}: specroute {shlex.join(argv)}\n{error}"


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
