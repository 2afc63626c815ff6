"""What a backend's failure becomes for the client: its own 4xx/5xx with its message, or the
proxy's error when the last attempt failed before the reply began (a timeout that states its
limit, a bad reply, a reply too large, no answer)."""

from __future__ import annotations

from typing import Any

import msgspec

from specroute.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from specroute.pool import BadReply, ReplyTooLarge, TimedOut, UpstreamFailure

__all__ = ["attempt_error", "upstream_error"]

_upstream_error = msgspec.json.Decoder(dict[str, Any])


def attempt_error(name: str, exc: UpstreamFailure) -> UpstreamError:
    """What the client gets when the last attempt failed before its reply began."""
    if isinstance(exc, TimedOut):
        return UpstreamTimeoutError(f"backend {name} timed out: {exc}")
    if isinstance(exc, BadReply):
        return UpstreamError(f"backend {name} sent a bad reply: {exc}", code="bad_upstream_reply")
    if isinstance(exc, ReplyTooLarge):
        return UpstreamError(f"backend {name}: {exc}", code="upstream_reply_too_large")
    return UpstreamUnavailableError(f"backend {name} failed: {exc}")


def upstream_error(status: int, body: bytes) -> UpstreamError:
    """An upstream 4xx/5xx as our error with the same status and the upstream's message."""
    message, kind = f"backend answered {status}", None
    try:
        data = _upstream_error.decode(body)
    except msgspec.DecodeError:
        # A plain-text refusal (a server's or a load balancer's own page): its first line is
        # the reason, so the client learns why and not only that.
        text = body[:300].decode("utf-8", "replace").strip().splitlines()
        data = {"message": f"{message}: {text[0][:200]}"} if text and text[0].isprintable() else {}
    detail = data.get("error", data)
    if isinstance(detail, dict):
        # OpenAI's and SGLang's {"message"}, or FastAPI's (and Litestar's) {"detail"}.
        reason = detail.get("message") or detail.get("detail")
        message = str(reason) if isinstance(reason, str) and reason else message
        kind = detail.get("type")
    elif isinstance(detail, str):
        message = detail
    exc = UpstreamError(message, status=status)
    exc.error_type = kind if isinstance(kind, str) else "invalid_request_error"
    return exc
