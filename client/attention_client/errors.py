"""The service's errors as exceptions: one JSON shape, a class per status worth catching."""

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ErrorItem:
    """One problem of an error answer: the field at fault (``None``: the body) and why."""

    field: str | None
    message: str
    type: str
    limit: int | None = None


class ServiceError(Exception):
    """An error answered by the service (any status ≥ 400).

    ``status`` is the HTTP status, ``message`` the first problem as a sentence, ``errors`` every
    problem the service listed, ``field`` the first one's field (e.g. ``"mask[0].matrix"``) and
    ``request_id`` the answer's ``X-Request-ID`` (quote it when reporting a problem).
    """

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[ErrorItem] | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.errors = errors or []
        self.request_id = request_id

    @property
    def field(self) -> str | None:
        """The field of the first problem, or ``None`` when it concerns the whole body."""
        return self.errors[0].field if self.errors else None


class InvalidRequest(ServiceError):
    """422: valid syntax that does not fit (types, shapes, modes, masks, unknown fields…)."""


class TooLarge(ServiceError):
    """413: the body, a size, the result or the computation is over a limit (see ``.limit``)."""

    @property
    def limit(self) -> int | None:
        """The configured limit that was exceeded, when the service names it."""
        return self.errors[0].limit if self.errors else None


class Unauthorized(ServiceError):
    """401: the service has API keys and the request carried none or a wrong one."""


class ModelNotInstalled(ServiceError):
    """501: a trained model the service knows but whose files are not installed where it runs;
    ``install_command`` is how its operator installs them (``make models``)."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[ErrorItem] | None = None,
        request_id: str | None = None,
        install_command: str | None = None,
    ) -> None:
        super().__init__(status, message, errors, request_id)
        self.install_command = install_command


class Overloaded(ServiceError):
    """503: the service is busy; ``retry_after`` is the wait it asked for, in seconds."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[ErrorItem] | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, message, errors, request_id)
        self.retry_after = retry_after


_CLASSES: dict[int, type[ServiceError]] = {
    401: Unauthorized,
    413: TooLarge,
    422: InvalidRequest,
}


def retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds, when it is a number."""
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the caller's backoff applies


def _item(raw: Any) -> ErrorItem:
    """One entry of ``errors``, tolerant of missing keys."""
    raw = raw if isinstance(raw, dict) else {}
    limit = raw.get("limit")
    return ErrorItem(
        field=raw.get("field"),
        message=str(raw.get("message", "")),
        type=str(raw.get("type", "")),
        limit=limit if isinstance(limit, int) else None,
    )


def error_from(response: httpx.Response) -> ServiceError:
    """The exception for an error answer (its JSON body, or its text when it is not JSON)."""
    request_id = response.headers.get("x-request-id")
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "message" in body:
        message = str(body["message"])
        items = [_item(e) for e in body.get("errors") or []]
    else:
        message = response.text[:500] or response.reason_phrase
        items = []
    status = response.status_code
    if status == 503:
        return Overloaded(status, message, items, request_id, retry_after(response))
    if status == 501 and any(item.type == "model_not_installed" for item in items):
        assert isinstance(body, dict)  # items come from a JSON body
        command = body.get("install_command")
        return ModelNotInstalled(
            status, message, items, request_id, command if isinstance(command, str) else None
        )
    return _CLASSES.get(status, ServiceError)(status, message, items, request_id)
