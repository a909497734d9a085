"""The FastAPI application."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service import __version__
from service.api import errors, ops
from service.api.middleware import RequestMiddleware
from service.api.routes import router
from service.config import Settings, get_settings

DESCRIPTION = """
Computes transformer attention step by step and returns every intermediate as JSON.

Conventions: `weight_layout` `in_out` is `X @ W` (default), `out_in` is `X @ W.T` (PyTorch
weights as they are); scale defaults to `1/sqrt(d_k)`; boolean masks: `true` = may attend;
causal alignment `upper_left` by default; masked scores are `null` in JSON (−∞).
Every response echoes them under `conventions`. Use the examples in each endpoint's
"Try it out".
"""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    ops.warm_up()
    app.state.ready = True
    yield
    app.state.ready = False


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; ``settings`` defaults to the environment's (see service.config)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="Attention service",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.ready = False
    errors.install(app)
    app.include_router(router)
    app.include_router(ops.router)
    ops.install_docs(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-ID"],
            expose_headers=["X-Request-ID"],
        )
    paths = frozenset(str(getattr(r, "path", "")) for r in app.routes)
    app.add_middleware(RequestMiddleware, max_body_bytes=settings.max_body_bytes, paths=paths)
    return app
