"""Optional API keys for the compute endpoints (health, metrics and docs stay open)."""

import hmac
from typing import Annotated

from fastapi import HTTPException, Request, Security
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


async def require_api_key(
    request: Request,
    api_key: Annotated[str | None, Security(_api_key)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],  # for /docs
) -> None:
    """401 unless the request carries a configured key (the middleware checks it before the
    body is read; this dependency documents it in /docs and checks it again)."""
    keys: list[str] = request.app.state.settings.api_keys
    problem = key_problem(api_key, request.headers.get("authorization"), keys)
    if problem:
        raise HTTPException(401, problem, headers={"WWW-Authenticate": "Bearer"})
