"""Logging as one JSON object a line; the uvicorn log config used by ``python -m service``."""

import logging
import sys
import time
from typing import Any

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "message", ...extra fields} on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def log_config(level: str) -> dict[str, Any]:
    """A dictConfig for uvicorn: its own logs and the service's access lines, all as JSON."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "service": {"handlers": ["default"], "level": level.upper(), "propagate": False},
        },
    }


def configure(level: str) -> None:
    """Set the service's log level; give its loggers the JSON handler when nothing configured
    them (the app served by a plain `uvicorn service.main:app`, not `python -m service`)."""
    logger = logging.getLogger("service")
    logger.setLevel(level.upper())
    # the JSON lines show none of these: LogRecord need not look them up for every line
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
