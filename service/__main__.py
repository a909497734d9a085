"""``python -m service [--host H] [--port P] [--workers N]``: serve with uvicorn."""

import argparse
import errno
import logging.config
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from service.config import Settings, get_settings, problems, unknown_variables

BAD_SETTING = 2  # the exit status of a setting with a wrong value (as argparse's usage errors)


def available_cpus(root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: the cgroup quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``),
    else the affinity mask."""
    quota = period = ""
    try:
        with open(f"{root}/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:
            with (
                open(f"{root}/cpu/cpu.cfs_quota_us") as q,
                open(f"{root}/cpu/cpu.cfs_period_us") as p,
            ):
                quota, period = q.read().strip(), p.read().strip()
        except OSError:
            pass
    if quota.isdigit() and period.isdigit() and int(period) > 0:  # "max" or -1: no quota
        return max(1, int(quota) // int(period))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _prepare_environment(workers: int) -> None:
    """Before any worker imports NumPy or prometheus_client: share one BLAS budget among the
    workers (threads × workers ≤ cores, unless already set) and give the metrics a directory
    that every worker writes to."""
    os.environ["ATTENTION_WORKERS"] = str(workers)  # each worker's share of the memory budget
    threads = str(max(1, available_cpus() // workers))
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, threads)
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="attention-metrics-")
    for mark in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob("cut-*"):  # an earlier run's
        mark.unlink()


def _stop_status() -> int:
    """0 when every answer was complete at the stop; 1 when the grace period ran out and some
    were cut (each worker leaves a mark for them: service.http.middleware)."""
    marks = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")).glob("cut-*")
    return 1 if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and any(marks) else 0


def _exit_cleanly(signum: int, frame: object) -> None:
    """uvicorn finishes in-flight requests on SIGTERM, restores this handler, then re-raises
    the signal into it: unwind, and let :func:`main` say how the stop went."""
    sys.exit(0)


def _check_address(host: str, port: int) -> None:
    """Exit with a one-line hint, before announcing any URL, when the address cannot be
    listened on (a port already in use, a privileged port, an address not on this host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                why = f"port {port} is in use (another server runs there?)"
            else:
                why = f"cannot listen on {host}:{port} ({error.strerror})"
            sys.exit(
                f"{why}: choose another with make run PORT={port + 1}, "
                f"python -m service --port {port + 1} or ATTENTION_PORT={port + 1}"
            )


def _settings() -> Settings:
    """The environment's settings; a wrong value exits with status 2 and one line on stderr
    for each (the variable, its value, what it takes) rather than pydantic's traceback."""
    try:
        return get_settings()
    except ValidationError as error:
        print("\n".join(problems(error)), file=sys.stderr)
        sys.exit(BAD_SETTING)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line (defaults from ATTENTION_* settings) and run uvicorn."""
    settings = _settings()
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
    _check_address(args.host, args.port)
    _prepare_environment(args.workers)

    import uvicorn

    from service.logs import log_config

    logging.config.dictConfig(log_config(settings.log_level))
    for line in unknown_variables(os.environ):  # a misspelt setting would be ignored silently
        logging.getLogger("service").warning(line)
    shown = "localhost" if args.host in ("0.0.0.0", "::", "") else args.host
    base = f"http://{shown}:{args.port}{settings.root_path}"
    logging.getLogger("service").info(
        f"the explorer is at {base}/ and the API docs at {base}/docs",
        extra={"explorer": f"{base}/", "docs": f"{base}/docs"},
    )
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.run(
            "service.main:app",
            host=args.host,
            port=args.port,
            workers=args.workers,
            # limits and deadlines per connection; by name, so that only workers import it
            http="service.http.connection:GuardedProtocol",
            server_header=False,  # no "server: uvicorn" on every answer
            ws="none",  # no WebSocket endpoints: an Upgrade request is answered as plain HTTP
            log_config=log_config(settings.log_level),
            access_log=False,
            proxy_headers=True,
            timeout_graceful_shutdown=settings.graceful_seconds,
            # the supervisor kills a worker that does not answer its ping in time; a worker
            # parsing a large body holds the GIL for a while, which is busy, not hung
            timeout_worker_healthcheck=30,
        )
    except SystemExit as stop:  # SIGTERM, once the answers in flight are done or cut
        if stop.code not in (None, 0):
            raise
    sys.exit(_stop_status())  # after every cut answer has left its mark (asyncio.run's cleanup)


if __name__ == "__main__":
    main()
