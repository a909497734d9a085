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


async def require_api_key(
    request: Request,
    api_key: Annotated[str | None, Security(_api_key)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> None:
    """401 unless the request carries a configured key; nothing to do when none is configured."""
    keys: list[str] = request.app.state.settings.api_keys
    if not keys:
        return
    given = api_key or (bearer.credentials if bearer else None)
    if given is None:
        raise HTTPException(
            401,
            "this service requires an API key: send Authorization: Bearer <key> or X-API-Key: <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _matches(given, keys):
        raise HTTPException(401, "the API key is not valid", headers={"WWW-Authenticate": "Bearer"})
