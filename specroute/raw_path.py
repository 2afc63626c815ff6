"""A path parameter read from the request's raw path: routers collapse `//`, and SGLang serves
model names that hold it (`s3://bucket/model`), as FastAPI passes it on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["path_after"]


def path_after(scope: Mapping[str, Any], prefix: str) -> str | None:
    """The decoded raw path after `prefix` (`/v1/models/`), or None if it does not start so."""
    raw = unquote(bytes(scope.get("raw_path") or b"").decode("latin-1").partition("?")[0])
    return raw.removeprefix(prefix) if raw.startswith(prefix) else None
