"""`specroute config example`: the example configuration written from the config types, so that
it lists every setting with its default, type and docstring, and cannot drift from them."""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import msgspec

from specroute.cmdline import Subcommands
from specroute.config import BackendConfig, Config
from specroute.structdoc import describe_type, field_docs

__all__ = ["EXAMPLE_PATH", "register", "render_example"]

EXAMPLE_PATH = "examples/specroute.toml"
EXAMPLE_BACKENDS = (
    {"url": "http://127.0.0.1:30001", "name": "steps1"},
    {"url": "http://127.0.0.1:30002", "name": "steps2"},
    {"url": "http://127.0.0.1:30003", "name": "steps3"},
)
"""Backends are the one setting without a default: three servers, depths 1 to 3."""

HEADER = f"""\
# specroute serve --config {EXAMPLE_PATH}
#
# Every setting, with its default, its type and what it does. Written by
# `specroute config example > {EXAMPLE_PATH}` from the types in specroute/config.py:
# regenerate it instead of editing it (tests/test_example_config.py compares the two).
# Settings left unset (commented out below) show an example value, not a default.
#
# SPECROUTE_* environment variables override this file: SPECROUTE_PORT=8001, nested fields
# with a double underscore (SPECROUTE_TIMEOUTS__IDLE_S=60), lists comma-separated
# (SPECROUTE_API_KEYS=key1,key2; SPECROUTE_BACKENDS=steps1=http://a:30000,http://b:30000).
# A SPECROUTE_* name that is no setting is an error. Command-line flags override both.
"""

_WIDTH = 100
mi = msgspec.inspect


def _toml(value: Any) -> str:
    """One value in TOML: the types a config holds (strings, numbers, booleans, lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(text: str) -> list[str]:
    lines: list[str] = []
    for paragraph in text.split("\n\n"):
        flat = " ".join(paragraph.split())
        lines += textwrap.wrap(flat, _WIDTH - 2, initial_indent="# ", subsequent_indent="# ")
    return lines


def _default(field: mi.Field) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return msgspec.to_builtins(field.default)
    if field.default_factory is not msgspec.NODEFAULT:
        return msgspec.to_builtins(field.default_factory())
    return None


def _example(kind: mi.Type) -> Any:
    """The first `Meta(examples=...)` value in a field's type, if any."""
    if isinstance(kind, mi.Metadata):
        examples = (kind.extra_json_schema or {}).get("examples")
        return examples[0] if examples else _example(kind.type)
    if isinstance(kind, mi.UnionType):
        found = [_example(t) for t in kind.types]
        return next((e for e in found if e is not None), None)
    return None


def _is_section(field: mi.Field) -> bool:
    return isinstance(field.type, mi.StructType)


def _field_lines(field: mi.Field, doc: str | None, given: dict[str, Any]) -> list[str]:
    kind = "(" + describe_type(field.type) + (", required" if field.required else "") + ")"
    lines = _comment(doc) if doc else []
    if lines and len(lines[-1]) + 1 + len(kind) <= _WIDTH:
        lines[-1] += " " + kind  # the type goes after the doc, never split across lines
    else:
        lines.append(f"# {kind}")
    value = given.get(field.name, _default(field))
    if value is None:
        example = _example(field.type)
        shown = _toml(example) if example is not None else ""
        lines.append(f"# {field.name} = {shown}".rstrip())
    else:
        lines.append(f"{field.name} = {_toml(value)}")
    return lines


def _table(struct: type[msgspec.Struct], header: str, given: dict[str, Any]) -> Iterator[str]:
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    docs = field_docs(struct)
    yield header
    for field in info.fields:
        yield from _field_lines(field, docs.get(field.name), given)


def _backends(field: mi.Field, doc: str | None) -> Iterator[str]:
    yield ""
    yield from _comment(f"{doc or 'backends'}")
    yield from _comment(BackendConfig.__doc__ or "")
    yield from _table(BackendConfig, "[[backends]]", EXAMPLE_BACKENDS[0])
    for backend in EXAMPLE_BACKENDS[1:]:
        yield ""
        yield "[[backends]]"
        yield from (f"{key} = {_toml(value)}" for key, value in backend.items())


def render_example() -> str:
    """The example configuration: top-level settings, the backends, then one table a section."""
    info = mi.type_info(Config)
    assert isinstance(info, mi.StructType)
    docs = field_docs(Config)
    lines = [HEADER.rstrip("\n")]
    sections = [f for f in info.fields if _is_section(f)]
    for field in info.fields:
        if field.name != "backends" and not _is_section(field):
            lines.append("")
            lines += _field_lines(field, docs.get(field.name), {})
    for field in info.fields:
        if field.name == "backends":
            lines += _backends(field, docs.get(field.name))
    for field in sections:
        assert isinstance(field.type, mi.StructType)
        struct = field.type.cls
        lines += ["", *_comment(struct.__doc__ or "")]
        lines += _table(struct, f"[{field.name}]", {})
    return "\n".join(lines) + "\n"


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "config",
        description=(
            "`specroute config example` prints a configuration file that lists every setting of "
            "`specroute serve` with its default, type and documentation."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    example = actions.add_parser("example", help="print the example configuration (TOML)")
    example.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(render_example())
    return 0
