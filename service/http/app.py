"""The FastAPI application."""

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from service import __version__, logs
from service.config import Settings, get_settings
from service.core.chain import BLOCK, HEAD
from service.http import metrics, models, ops
from service.http.auth import documents_api_key
from service.http.budget import Budget, worker_budget
from service.http.middleware import RequestMiddleware
from service.http.parser import Parser
from service.http.routes import DIRECT, REQUEST_MODELS, router
from service.models import answer
from service.wire import errors
from service.wire.schemas.model_fields import ModelRequest

DESCRIPTION = """
Computes transformer attention step by step and returns every intermediate as JSON.

Conventions: `weight_layout` `in_out` is `X @ W` (default), `out_in` is `X @ W.T` (PyTorch
weights as they are); scale defaults to `1/sqrt(d_k)`; boolean masks: `true` = may attend;
causal alignment `upper_left` by default; masked scores are `null` in JSON (−∞).
Every response echoes them under `conventions`. Use the examples in each endpoint's
"Try it out".
"""


def chain_table() -> list[dict[str, str]]:
    """The steps of one head in order (service.core.chain's HEAD), then the block's after the
    heads (BLOCK), each with its kind (what it does: ``rotate``, ``norm``, ``clip``, …), the
    slot it reads and the slot whose latest form it makes: the OpenAPI document's ``x-chain``,
    which the page reads for the order of an answer's forms and the arithmetic of a cell. A
    step stated twice (q_normed before RoPE, or after it) is listed twice; an answer's
    ``steps`` say which one ran."""
    return [
        {"name": s.name, "kind": s.kind, "reads": s.reads, "advances": s.advances}
        for s in HEAD + BLOCK
    ]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    ops.warm_up()
    app.state.ready = True
    yield
    app.state.ready = False
    app.state.parser.close(wait=True)


def _document_request_models(app: FastAPI) -> None:
    """The compute routes parse their bodies themselves (see service.http.routes); put their
    request models into the OpenAPI components so /docs still describes every field."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            documented: tuple[type[BaseModel], ...] = (*REQUEST_MODELS, ModelRequest)
            for model in documented:
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
            schema["x-chain"] = chain_table()
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class _Service(FastAPI):
    """FastAPI behind the service's own door: ``outer`` (CORS when configured, then the request
    middleware) wraps FastAPI's whole stack rather than sitting inside its error and exception
    layers, so the answers the door gives itself (a compute POST once its body is read, a
    refusal before it) pass through none of them. Everything else goes on to FastAPI's stack
    as before; an error no handler takes is a 500 from uvicorn, as from that stack."""

    outer: tuple[Middleware, ...] = ()  # outermost first

    def build_middleware_stack(self) -> ASGIApp:
        app = super().build_middleware_stack()
        for cls, args, kwargs in reversed(self.outer):
            app = cls(app, *args, **kwargs)
        return app


def _leaves(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes that answer requests: FastAPI wraps each included router in one route (its
    ``original_router`` holds the real ones; none is included with a prefix)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is None:
            yield route
        else:
            yield from _leaves(inner.routes)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; ``settings`` defaults to the environment's (see service.config)."""
    settings = settings or get_settings()
    logs.configure(settings.log_level)
    app = _Service(
        title="Attention service",
        # FastAPI's own OpenTelemetry hooks look the providers up on every request; the
        # service's metrics and access log are its own (service.http.metrics, middleware)
        telemetry={"tracing": False, "metrics": False, "logs": False},
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan,
        root_path=settings.root_path,  # here, so `uvicorn service.main:app` honours it too
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.budget = Budget(
        worker_budget(settings), settings.queue_length, settings.queue_wait_seconds
    )
    app.state.parser = Parser(settings.parse_concurrency)  # large bodies parse there
    metrics.BUDGET.set(app.state.budget.total)
    errors.install(app)
    keyed = [Depends(documents_api_key)] if settings.api_keys else []  # /docs' padlock only
    app.include_router(router, dependencies=keyed)
    app.include_router(ops.router)
    app.include_router(ops.keyed_router, dependencies=keyed)
    app.include_router(models.router, dependencies=keyed)
    app.include_router(models.keyed_router, dependencies=keyed)  # /models: keyed like /version
    ops.install_docs(app)
    ops.install_explorer(app)
    _document_request_models(app)
    app.router.redirect_slashes = False  # the middleware redirects, relatively (no Host echoed)
    compute = frozenset(
        str(getattr(r, "path", "")) for r in [*router.routes, *models.router.routes]
    )
    door = Middleware(
        RequestMiddleware,
        max_body_bytes=settings.max_body_bytes,
        routes=list(_leaves(app.router.routes)),
        json_paths=compute,
        keyed_paths=compute | {"/version", "/models"},
        api_keys=settings.api_keys,
        direct=DIRECT,
        body_limits={"/model": (answer.max_body_bytes(settings), answer.BODY_ADVICE)},
    )
    cors = Middleware(
        CORSMiddleware,
        allow_origins=settings.cors_origins,
        allow_methods=["GET", "POST"],
        allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-ID"],
        expose_headers=["X-Request-ID"],
    )
    # CORS outermost: preflights and early answers get its headers
    app.outer = (cors, door) if settings.cors_origins else (door,)
    return app
