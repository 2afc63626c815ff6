"""Configure structlog once at start-up: readable on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging"]


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is at write time, so a logger cached early (module
    level, first use) never holds on to a stream that was replaced and closed since."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Set up structlog for the whole process; call once from the command entry point."""
    as_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # PrintLogger only calls write() and flush(): the proxy stands in for a TextIO.
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
