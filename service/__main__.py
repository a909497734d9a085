"""``python -m service [--host H] [--port P] [--workers N]``: serve with uvicorn."""

import argparse

import uvicorn

from service.config import get_settings


def main(argv: list[str] | None = None) -> None:
    """Parse the command line (defaults from ATTENTION_* settings) and run uvicorn."""
    settings = get_settings()
    parser = argparse.ArgumentParser(
        prog="python -m service", description="Run the attention service."
    )
    parser.add_argument("--host", default=settings.host, help=f"address (default {settings.host})")
    parser.add_argument(
        "--port", type=int, default=settings.port, help=f"port (default {settings.port})"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=settings.workers,
        help=f"worker processes (default {settings.workers})",
    )
    args = parser.parse_args(argv)
    uvicorn.run(
        "service.main:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=settings.log_level,
    )


if __name__ == "__main__":
    main()
