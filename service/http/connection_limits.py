"""The limits of one worker's connections (service.http.connection), from the settings, and the
answer a connection gives itself when one is passed."""

import contextlib
import resource
from dataclasses import dataclass
from functools import cache

from service.config import get_settings

OWN_FILES = 64  # descriptors a worker keeps for itself (listening socket, parser pipes, logs)


@dataclass(frozen=True)
class Limits:
    """The connection limits of one worker (from the settings)."""

    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    send_timeout: float
    answer_timeout: float
    min_rate: int
    max_connections: int
    max_body_bytes: int


@cache
def limits() -> Limits:
    """This worker's limits: the settings, with the connection cap lowered to fit the
    process's open-file limit (its soft limit raised to the hard one first)."""
    s = get_settings()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = s.max_connections + OWN_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:  # (else the hard limit is the soft one: nothing to raise)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    cap = (
        s.max_connections
        if soft == resource.RLIM_INFINITY
        else min(s.max_connections, max(1, soft - OWN_FILES))
    )
    return Limits(
        s.max_header_bytes,
        s.max_headers,
        s.header_timeout_seconds,
        s.body_timeout_seconds,
        s.send_timeout_seconds,
        s.answer_timeout_seconds,
        s.min_transfer_rate,
        cap,
        s.max_body_bytes,
    )


@dataclass(frozen=True)
class Refusal:
    """An answer the connection gives itself, before or instead of the app."""

    status: int
    kind: str  # the error's type, and the access log's reason
    message: str
    linger: bool = True  # drain what the client is still sending before closing
