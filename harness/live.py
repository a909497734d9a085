"""A real `python -m service` (uvicorn) on a free loopback port, for end-to-end tests."""

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """GET (or POST a JSON body) and return (status, decoded JSON)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def start_server(
    workers: int = 1,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    plain_uvicorn: bool = False,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `python -m service` (or `python -m uvicorn service.main:app`) on a free port and
    return once /healthz answers; the caller stops it. Its output goes to ``log`` when given;
    from ``cwd`` (whose ``service`` it then runs: another checkout's) when given."""
    port = free_port()
    where = ["--host", "127.0.0.1", "--port", str(port)]
    if plain_uvicorn:
        cmd = [sys.executable, "-m", "uvicorn", "service.main:app", *where]
    else:
        cmd = [sys.executable, "-m", "service", *where, "--workers", str(workers)]
    # a file, not a pipe: a pipe nobody reads fills up and stalls the server; it lives as long as
    # the server, so no context manager here
    out = tempfile.TemporaryFile() if log is None else log.open("w+b")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if http_json(base + "/healthz")[0] == 200:
                return proc, base
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out.seek(0)
            pytest.fail(f"server did not start:\n{out.read().decode(errors='replace')}")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Stop a server from :func:`start_server` with SIGTERM; kill it, and fail, if it has not
    exited within ``timeout`` seconds (a graceful stop that hangs is a defect)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
