"""The FastAPI application."""

from fastapi import FastAPI

from service import __version__
from service.api import errors
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


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; ``settings`` defaults to the environment's (see service.config)."""
    settings = settings or get_settings()
    app = FastAPI(title="Attention service", version=__version__, description=DESCRIPTION)
    app.state.settings = settings
    errors.install(app)
    app.include_router(router)
    return app
