"""Documentation read from msgspec Structs: each field's docstring (the string below it) and its
type in a few words, for `specroute policies` and the generated example configuration."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap

import msgspec

__all__ = ["describe_type", "field_docs"]


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
