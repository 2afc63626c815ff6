"""One exception tree for everything the proxy can answer with an error, and its one renderer.

SpecrouteError                      500 internal_error
├── ConfigError                     (exit status 2 at start-up; never rendered)
├── BadRequestError                 400 invalid_request_error
├── AuthenticationError             401 invalid_request_error / invalid_api_key
├── PermissionDeniedError           403 permission_error
├── NotFoundError                   404 invalid_request_error
│   └── ModelNotFoundError          404 invalid_request_error / model_not_found
├── RequestTimeoutError             408 invalid_request_error (a client too slow to send)
├── PayloadTooLargeError            413 invalid_request_error
├── HeadersTooLargeError            431 invalid_request_error
├── QueueFullError                  429 rate_limit_error (Retry-After)
├── ServiceUnavailableError         503 service_unavailable (Retry-After)
│   ├── NoHealthyBackendError
│   └── QueueTimeoutError
└── UpstreamError                   the upstream's own status, upstream_error
    ├── UpstreamUnavailableError    502 (connection failures on every attempt)
    ├── UpstreamTimeoutError        504 timeout
    └── StreamInterruptedError      (inside a stream: the backend failed after the headers)
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "HeadersTooLargeError",
    "ModelNotFoundError",
    "NoHealthyBackendError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueueFullError",
    "QueueTimeoutError",
    "RequestTimeoutError",
    "ServiceUnavailableError",
    "SpecrouteError",
    "StreamInterruptedError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "error_body",
    "error_event",
]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorDetail


_encoder = msgspec.json.Encoder()


class SpecrouteError(Exception):
    """Base of every error specroute raises on purpose; carries what the client is told."""

    status_code: ClassVar[int] = 500
    error_type: str = "internal_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return self.status_code

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers this error asks for (Retry-After)."""
        if self.retry_after is None:
            return []
        return [(b"retry-after", str(max(1, round(self.retry_after))).encode())]


class ConfigError(SpecrouteError):
    """The configuration (file, environment or flags) is invalid; the message names the field."""


class BadRequestError(SpecrouteError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationError(SpecrouteError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(SpecrouteError):
    status_code = 403
    error_type = "permission_error"


class NotFoundError(SpecrouteError):
    status_code = 404
    error_type = "invalid_request_error"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class PayloadTooLargeError(SpecrouteError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RequestTimeoutError(SpecrouteError):
    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class HeadersTooLargeError(SpecrouteError):
    status_code = 431
    error_type = "invalid_request_error"
    default_code = "headers_too_large"


class QueueFullError(SpecrouteError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "queue_full"


class ServiceUnavailableError(SpecrouteError):
    status_code = 503
    error_type = "service_unavailable"


class NoHealthyBackendError(ServiceUnavailableError):
    default_code = "no_healthy_backend"


class QueueTimeoutError(ServiceUnavailableError):
    default_code = "queue_timeout"


class UpstreamError(SpecrouteError):
    """An error from a backend, passed on with the backend's own status."""

    status_code = 502
    error_type = "upstream_error"

    def __init__(
        self, message: str, *, status: int | None = None, code: str | int | None = None
    ) -> None:
        super().__init__(message, code=code)
        self._status = status

    @property
    def status(self) -> int:
        return self._status if self._status is not None else self.status_code


class UpstreamUnavailableError(UpstreamError):
    default_code = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    status_code = 504
    error_type = "timeout"
    default_code = "upstream_timeout"


class StreamInterruptedError(UpstreamError):
    default_code = "stream_interrupted"


def _envelope(exc: SpecrouteError) -> ErrorEnvelope:
    return ErrorEnvelope(
        ErrorDetail(message=exc.message, type=exc.error_type, param=exc.param, code=exc.code)
    )


def error_body(exc: SpecrouteError) -> bytes:
    """The JSON body OpenAI clients expect: `{"error": {"message","type","param","code"}}`."""
    return _encoder.encode(_envelope(exc))


def error_event(exc: SpecrouteError) -> bytes:
    """The end of a failed stream: the error as one event, then `[DONE]`."""
    return b"data: " + error_body(exc) + b"\n\ndata: [DONE]\n\n"
