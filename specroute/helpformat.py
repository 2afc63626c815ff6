"""The command line's one help formatter: each option's default shown once, and only when it
says something."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsHelp", "first_paragraph"]


def first_paragraph(doc: str | None) -> str | None:
    """A module docstring's first paragraph, whole sentences, for a parser's description."""
    return doc.split("\n\n", 1)[0].strip() if doc else None


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends `(default: X)` except where X says nothing (None, False, empty) or the help
    already names its default; lists show as they are typed (`1,4,16`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default, text = action.default, action.help or ""
        empty = default is None or default is False or default in ([], (), {})
        if empty or default is argparse.SUPPRESS or "default" in text:
            return action.help
        if isinstance(default, list | tuple):
            shown = ",".join(str(value) for value in default)
            return f"{text} (default: {shown})".strip()
        return super()._get_help_string(action)
