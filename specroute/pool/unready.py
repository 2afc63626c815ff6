"""Why a backend's /ready (vLLM: /health) check failed, in a few words for the log and for a
503's message: connection refused, a name that does not resolve, no answer in time, or the
status it gave."""

from __future__ import annotations

import errno
import socket

from specroute.pool.client import TimedOut, UpstreamFailure

__all__ = ["probe_failure", "status_failure"]


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def probe_failure(exc: UpstreamFailure, timeout_s: float) -> str:
    """`connection refused`, `name not resolved`, `no answer within 2 s`, else the error."""
    chain = _causes(exc)
    if any(isinstance(e, socket.gaierror) for e in chain):
        return "name not resolved"
    if any(isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in chain):
        return "connection refused"
    text = " ".join(str(e) for e in chain)
    if "Errno 111" in text or "Connection refused" in text:  # the errno lost in a message
        return "connection refused"
    if isinstance(exc, TimedOut) or any(isinstance(e, TimeoutError) for e in chain):
        return f"no answer within {timeout_s:g} s"
    return str(exc) or type(exc).__name__


def status_failure(status: int, path: str = "/ready") -> str:
    """A reply that is not 200: SGLang answers 503 while it loads or is overloaded (vLLM's
    /health too, once its engine died)."""
    return f"{path} answered {status}"
