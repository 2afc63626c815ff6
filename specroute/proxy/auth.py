"""API and admin keys, and which keys may name a workload class: Bearer tokens compared in
constant time; keys are never logged."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from specroute.errors import AuthenticationError, PermissionDeniedError

__all__ = ["ADMIN", "PUBLIC", "Auth", "access_of", "bearer", "matches", "presented_key"]

PUBLIC = {"access": "public"}
"""Route option: no key needed (liveness, readiness, Prometheus)."""
ADMIN = {"access": "admin"}
"""Route option: the admin key only. Routes without an `access` option need a client key."""


def access_of(opt: Mapping[str, object]) -> str:
    """A route's access level from its options; anything unmarked needs a client key."""
    access = opt.get("access")
    return str(access) if access in ("public", "admin") else "client"


def presented_key(authorization: bytes | None, api_key: bytes | None) -> bytes | None:
    """The key a client presents: its `Authorization` header, else its `x-api-key` (where
    Anthropic's clients send it) as a Bearer token."""
    if authorization is None and api_key is not None:
        return b"Bearer " + api_key
    return authorization


def matches(given: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether `given` is one of `keys`, in time that does not depend on which."""
    found = False
    for key in keys:  # no early exit: the time taken does not depend on which key matched
        found |= hmac.compare_digest(given, key)
    return found


def bearer(authorization: bytes | None) -> bytes | None:
    """The key in `Authorization: Bearer KEY`, else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token else None


class Auth:
    """Checks the `Authorization: Bearer KEY` header; open when no API keys are set."""

    __slots__ = ("_admin", "_class_keys", "_keys", "required")

    def __init__(
        self, api_keys: tuple[str, ...], admin_key: str | None, class_keys: tuple[str, ...] = ()
    ) -> None:
        self._admin = (admin_key.encode(),) if admin_key else ()
        self._keys = tuple(k.encode() for k in api_keys) + self._admin
        self._class_keys = tuple(k.encode() for k in class_keys) + self._admin
        self.required = bool(api_keys)

    def check(self, authorization: bytes | None) -> None:
        """API routes: any API key (or the admin key) when API keys are configured."""
        if not self.required:
            return
        token = bearer(authorization)
        if token is None:
            raise AuthenticationError("missing API key: send `Authorization: Bearer KEY`")
        if not matches(token, self._keys):
            raise AuthenticationError("invalid API key")

    def may_name_class(self, authorization: bytes | None) -> bool:
        """Whether a request with this (already checked) key may name its workload class:
        every request when no API keys are set, else one with a class key or the admin key."""
        if not self.required:
            return True
        token = bearer(authorization)
        return token is not None and matches(token, self._class_keys)

    def require(self, access: str, authorization: bytes | None) -> None:
        """Enforce `access` ("public", "client" or "admin") on one request."""
        if access == "admin":
            self.check_admin(authorization)
        elif access != "public":
            self.check(authorization)

    def check_admin(self, authorization: bytes | None) -> None:
        """Admin routes (PUT /policy): only the admin key; refused when none is configured."""
        if not self._admin:
            raise PermissionDeniedError("admin API disabled: configure admin_key")
        token = bearer(authorization)
        if token is None:
            raise AuthenticationError("missing admin key: send `Authorization: Bearer KEY`")
        if not matches(token, self._admin):
            raise AuthenticationError("invalid admin key")
