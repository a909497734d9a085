"""Settings from environment variables prefixed ATTENTION_ (e.g. ATTENTION_PORT=9000).

Built lazily by :func:`get_settings`; tests pass their own Settings to
:func:`service.http.app.create_app`. README lists every variable.
"""

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service, with its default."""

    model_config = SettingsConfigDict(env_prefix="ATTENTION_", extra="ignore")

    host: str = Field(
        "127.0.0.1",
        description="address to listen on (the container image sets 0.0.0.0 to be reachable)",
    )
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="log level; access lines are logged at info"
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="largest request body (413 above)"
    )
    max_result_numbers: int = Field(
        20_000_000,
        ge=1,
        description="most numbers one response may hold (413 above, before computing)",
    )
    max_computed_numbers: int = Field(
        50_000_000,
        ge=1,
        description="most numbers one request may compute, intermediates included whatever "
        "include says (413 above, before computing); 50M float64 is 400 MB",
    )
    max_seq_len: int = Field(4096, ge=1, description="largest L and S")
    models_dir: Path = Field(
        Path(__file__).resolve().parent.parent / "models",
        description="where the trained models of POST /model are (make models installs them)",
    )
    max_model_tokens: int = Field(
        128, ge=1, description="most tokens POST /model takes, special tokens counted (413 above)"
    )
    max_d_model: int = Field(4096, ge=1, description="largest d_model, d_k and d_v")
    max_heads: int = Field(128, ge=1, description="largest num_heads")
    max_batch: int = Field(256, ge=1, description="largest batch B")
    graceful_seconds: int = Field(
        30,
        ge=1,
        description="on SIGTERM, how long answers in flight may take to finish; longer ones are "
        "cut, logged as such, and the stop exits 1",
    )
    memory_budget_bytes: int | None = Field(
        None,
        ge=1,
        description="memory one worker may give to admitted requests (default: the container's "
        "memory limit ÷ workers, less headroom for the interpreter and for parsing bodies)",
    )
    queue_length: int = Field(
        64, ge=0, description="requests that may wait for memory per worker (503 beyond)"
    )
    queue_wait_seconds: float = Field(
        10.0, gt=0, description="longest wait for memory before a 503 with Retry-After"
    )
    parse_concurrency: int = Field(
        1,
        ge=1,
        description="parser processes per worker: bodies over 1 MiB are parsed there, one each "
        "at a time, so that parsing never stalls the worker's event loop",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="largest request head (request line and headers together); 431 and the "
        "connection closed as soon as more arrives",
    )
    max_headers: int = Field(100, ge=8, description="most header fields in one request (431 above)")
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="longest time from a connection's first byte (or its opening) to the end of "
        "the request's headers (408, then close)",
    )
    body_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="the request body must arrive at min_transfer_rate over each window this "
        "long (408, then close)",
    )
    send_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="while a client reads nothing, how long the answer may wait at less than "
        "min_transfer_rate before the connection is closed",
    )
    answer_timeout_seconds: float = Field(
        300.0,
        gt=0,
        description="the longest a client may keep one answer waiting once it reads slower than "
        "the answer is written: then it is disconnected and the answer's memory goes back (a "
        "reader just above min_transfer_rate would otherwise hold its share of the memory "
        "budget for as long as its answer takes)",
    )
    min_transfer_rate: int = Field(
        4096,
        ge=1,
        description="bytes per second a body must arrive at, and an answer must be read at",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="open connections per worker; more get 503 with Retry-After at once "
        "(lowered to fit the process's open-file limit)",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins allowed by CORS, comma-separated (empty: CORS closed; * for any)",
    )
    root_path: str = Field(
        "", description="path prefix when served behind a proxy, e.g. /attention"
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="comma-separated keys; when set, the compute endpoints require one "
        "(Authorization: Bearer KEY or X-API-Key: KEY). Empty: no authentication",
    )

    @field_validator("cors_origins", "api_keys", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        """ "a, b" -> ["a", "b"] (CORS origins and API keys are comma-separated lists)."""
        if isinstance(value, str):
            return [o.strip() for o in value.split(",") if o.strip()]
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
