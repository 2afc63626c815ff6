"""Documentation read from msgspec Structs: each field's docstring (the string below it) and its
type in a few words, for `specroute policies` and the generated example configuration."""

from __future__ import annotations

import ast
import difflib
import inspect
import itertools
import re
import textwrap
from typing import Any

import msgspec

__all__ = ["describe_type", "field_docs", "misspelt_hint"]

_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `([^`]*)`(?: - at `\$(.*)`)?$")


def field_docs(struct: type) -> dict[str, str]:
    """Each field's docstring, the string literal below its annotation, read from the source."""
    try:
        source = textwrap.dedent(inspect.getsource(struct))
    except (OSError, TypeError):  # no source (a frozen app): no docs, not an error
        return {}
    tree = ast.parse(source).body[0]
    body = tree.body if isinstance(tree, ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _bounds(kind: msgspec.inspect.IntType | msgspec.inspect.FloatType) -> str:
    if kind.ge is not None and kind.le is not None:
        return f" {kind.ge:g}..{kind.le:g}"
    marks = ((">", kind.gt), (">=", kind.ge), ("<", kind.lt), ("<=", kind.le))
    return "".join(f" {mark} {value:g}" for mark, value in marks if value is not None)


def describe_type(kind: msgspec.inspect.Type) -> str:
    """A field's type in a few words for help and comments: `integer >= 1`, `a|b`, ..."""
    mi = msgspec.inspect
    if isinstance(kind, mi.Metadata):
        return describe_type(kind.type)
    if isinstance(kind, mi.UnionType):
        given = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        text = " or ".join(describe_type(t) for t in given)
        return f"{text}, optional" if len(given) < len(kind.types) else text
    if isinstance(kind, mi.LiteralType):
        return "|".join(str(v) for v in kind.values)
    if isinstance(kind, mi.IntType | mi.FloatType):
        return ("integer" if isinstance(kind, mi.IntType) else "number") + _bounds(kind)
    if isinstance(kind, mi.VarTupleType | mi.ListType):
        return f"list of {describe_type(kind.item_type)}"
    names = {mi.StrType: "string", mi.BoolType: "true|false", mi.StructType: "table"}
    return names.get(type(kind), type(kind).__name__.removesuffix("Type").lower())


def _table(kind: Any) -> Any:
    """The struct a value of `kind` is, or holds a list of (None when none)."""
    mi = msgspec.inspect
    while True:
        if isinstance(kind, mi.Metadata):
            kind = kind.type
        elif isinstance(kind, mi.VarTupleType | mi.ListType):
            kind = kind.item_type
        elif isinstance(kind, mi.UnionType):
            kind = next((t for t in kind.types if isinstance(t, mi.StructType)), None)
        else:
            return kind if isinstance(kind, mi.StructType) else None


def misspelt_hint(message: str, root: type, fallback: str | None = None) -> str:
    """What to add to msgspec's `Object contains unknown field `polcy`` (`- at `$.lanes``)
    decoding `root`: `; did you mean policy?` from the fields of the table it is in, else
    `fallback`, else those fields; "" for any other message."""
    match = _UNKNOWN_FIELD.match(message)
    if match is None:
        return ""
    table = _table(msgspec.inspect.type_info(root))
    for part in re.findall(r"\.(\w+)", match.group(2) or ""):
        fields = {f.name: f.type for f in table.fields} if table is not None else {}
        table = _table(fields.get(part))
    names = [f.name for f in table.fields] if table is not None else []
    close = difflib.get_close_matches(match.group(1), names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}?"
    if fallback is not None or not names:
        return fallback or ""
    return f"; the fields there: {', '.join(names)}"
