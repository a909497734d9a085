"""Settings from environment variables prefixed ATTENTION_ (e.g. ATTENTION_PORT=9000).

Built lazily by :func:`get_settings`; tests override it through FastAPI's dependency overrides
or by passing a Settings object to :func:`service.api.app.create_app`.
"""

from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service, with its default."""

    model_config = SettingsConfigDict(env_prefix="ATTENTION_", extra="ignore")

    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    workers: int = Field(1, ge=1, description="uvicorn worker processes")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
