"""matplotlib for the PNG writers (`bench ... --plots`, `tune`): imported only when a plot is
drawn, and, where it is not installed, one sentence naming the extra that brings it."""

from __future__ import annotations

from typing import Any

__all__ = ["PLOT_EXTRA", "plots_missing", "pyplot"]

PLOT_EXTRA = "plot"


def plots_missing() -> str | None:
    """None when matplotlib imports; otherwise what to install, for the user to read."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"PNG plots need matplotlib: pip install 'specroute[{PLOT_EXTRA}]'"
    return None


def pyplot() -> Any:
    """`matplotlib.pyplot` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
