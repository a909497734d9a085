"""Optional API keys for the compute endpoints (health, metrics and docs stay open)."""

import hmac
from typing import Annotated

from fastapi import Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

_api_key = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    description="Only when the service has ATTENTION_API_KEYS set",
)
_bearer = HTTPBearer(
    auto_error=False, description="Only when the service has ATTENTION_API_KEYS set"
)


def _matches(given: str, keys: list[str]) -> bool:
    """Compare against every key in constant time (no early exit that would leak which matched)."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given.encode(), key.encode())
    return found


MISSING = "this service requires an API key: send Authorization: Bearer <key> or X-API-Key: <key>"
WRONG = "the API key is not valid"


def key_problem(api_key: str | None, authorization: str | None, keys: list[str]) -> str | None:
    """Why a request with these headers may not use a keyed endpoint (None: it may)."""
    if not keys:
        return None
    scheme, _, credentials = (authorization or "").partition(" ")
    given = api_key or (credentials.strip() if scheme.lower() == "bearer" else None)
    if not given:
        return MISSING
    return None if _matches(given, keys) else WRONG


async def documents_api_key(
    api_key: Annotated[str | None, Security(_api_key)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> None:
    """Draws /docs' padlock on the keyed endpoints and lets "Authorize" send the key; checks
    nothing: the middleware refuses a missing or wrong key (401, :func:`key_problem`) before
    the body is read, for every keyed path (service.http.middleware)."""
