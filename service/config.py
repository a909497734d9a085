"""Settings from environment variables prefixed ATTENTION_ (e.g. ATTENTION_PORT=9000).

Built lazily by :func:`get_settings`; tests pass their own Settings to
:func:`service.http.app.create_app`. docs/operations.md lists every variable. ``python -m service`` says in
one line what a wrong value should be (:func:`problems`) and warns about a variable that is no
setting (:func:`unknown_variables`), naming the closest one.
"""

import difflib
import types
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "ATTENTION_"
# ATTENTION_* variables read by the deployment files, not by the service: never warned about
NOT_SETTINGS = frozenset(
    {
        "ATTENTION_SUBNET",  # docker-compose.replicas.yml's network
        "ATTENTION_SERVERS",  # deploy/nginx's upstream servers
    }
)


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


# what a value of each type is, in words (Optional and list are read off the annotation)
KINDS: dict[object, str] = {
    int: "a whole number",
    float: "a number",
    str: "a string",
    Path: "a directory",
}
BOUNDS: tuple[tuple[type, str, str], ...] = (
    (annotated_types.Ge, "ge", "≥ {}"),
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Le, "le", "≤ {}"),
    (annotated_types.Lt, "lt", "< {}"),
)


def _kind(annotation: object) -> str:
    """``int`` → "a whole number", ``Literal["a", "b"]`` → "one of a, b", ``list[str]`` →
    "comma-separated values"."""
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(annotation))
    if origin is list:
        return "comma-separated values"
    return KINDS.get(annotation, str(annotation))


def takes(field: FieldInfo) -> str:
    """What a setting takes, in words: "a whole number ≥ 1 and ≤ 64 — uvicorn worker
    processes"."""
    annotation, optional = field.annotation, False
    if get_origin(annotation) in (Union, types.UnionType):  # X | None: may be left unset
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
        optional = True
    bounds = [
        text.format(getattr(rule, attribute))
        for kind, attribute, text in BOUNDS
        for rule in field.metadata
        if isinstance(rule, kind)
    ]
    words = " ".join([_kind(annotation), *([" and ".join(bounds)] if bounds else [])])
    words += ", or unset" if optional else ""
    return f"{words} — {field.description}" if field.description else words


def problems(error: ValidationError) -> list[str]:
    """One line per setting the environment got wrong: the variable, its value, what it
    takes."""
    lines = []
    for item in error.errors():
        name = str(item["loc"][0]) if item["loc"] else ""
        field = Settings.model_fields.get(name)
        if field is None:  # not one setting's: pydantic's own words
            lines.append(f"settings: {item['msg']}")
            continue
        lines.append(
            f"{PREFIX}{name.upper()}={item.get('input')!r} is not valid: it takes {takes(field)}"
        )
    return lines


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per ``ATTENTION_*`` variable that is no setting (a misspelt one is ignored by
    the settings), naming the closest setting."""
    known = [name.upper() for name in Settings.model_fields]
    lines = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(PREFIX) or upper in NOT_SETTINGS:
            continue
        name = upper.removeprefix(PREFIX)
        if name in known:
            continue
        closest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = (
            f"did you mean {PREFIX}{closest[0]}?"
            if closest
            else "docs/operations.md lists the settings"
        )
        lines.append(f"{variable} is not a setting of the service and is ignored: {hint}")
    return lines
