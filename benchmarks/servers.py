"""What the HTTP server itself costs a small request: several ASGI servers side by side, one run.

The service runs on uvicorn 0.54 with its own httptools protocol
(``service.http.connection:GuardedProtocol``). Could another server replace it? This script serves
one tiny **pure ASGI** app (defined below: no FastAPI, no middleware, so what differs between the
rows is the server) with each of:

- uvicorn, httptools + uvloop, stock protocol;
- uvicorn with the service's ``GuardedProtocol`` (otherwise the same launch);
- uvicorn, h11 + uvloop;
- hypercorn, asyncio worker, and its uvloop worker;
- granian, ASGI interface, 1 worker, 1 runtime thread, ``--loop asyncio`` and ``--loop uvloop``.

Every uvicorn row is launched like ``python -m service`` launches the service (no server
header, ``ws="none"``, no access log, proxy headers, uvloop), only the ``http`` protocol differs.
hypercorn and granian run with their defaults plus one worker, no access log (their default),
HTTP/1 (granian ``--http 1 --no-ws``). One worker each, on a free 127.0.0.1 port, all started
before the first measurement and left idle while the others are measured; every one gets the
same environment (``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` = the CPUs
this process may use, ``PYTHONPATH`` = the repository). uvicorn and hypercorn serve in one
process (hypercorn ``-w 0``: no supervisor); granian always has a supervisor process besides its
worker, idle during the runs.

**Interpreter.** Every server runs under the Python of a side venv (``--venv``, created when
missing, from the interpreter this venv was made from): the service's locked runtime dependencies
(requirements.lock: the same uvicorn, httptools, uvloop, h11, NumPy and orjson as the project
venv; FastAPI etc. for GuardedProtocol's imports) plus hypercorn 0.18.0 and granian 2.8.9
(pip, from the package index, or ``--find-links DIR`` of downloaded wheels), and msgspec 0.22.0
for benchmarks/validation.py's comparison of validation paths when run with this venv's Python.
So all rows share one interpreter and one set of libraries; the script checks that those versions equal this venv's.

**App.** ``GET /healthz`` answers ``{"status":"ok"}``; ``POST /attention`` reads the body,
``orjson.loads``, the 3-token attention in NumPy (:func:`peers.attention`; the body is
the service's ``I_AM_BATMAN`` example, whose ``"weight_layout": "out_in"`` transposes the
weights), answers the 7 arrays as orjson bytes. Any other path: 404.

**Checks first.** Every server's POST answer must equal the NumPy result computed here to 1e-12,
its /healthz answer must be ``{"status":"ok"}``; a server that does not start (or answers
wrongly) is reported and left out. Every wrk run must have no non-2xx answer and no socket error
(the run is flagged, and the script exits 1, otherwise).

**Load.** ``wrk -t2 -c8 -d{seconds}s --latency`` (keep-alive connections; a Lua script for the
POST), first one untimed second per server and endpoint as warm-up, then ``--rounds`` rounds:
each round runs every server (the order rotating from round to round, and /healthz and
/attention swapping places) so that drift of the shared machine hits all of them alike. Reported:
the median requests/s of each (server, endpoint), its ratio to stock uvicorn httptools, and the
median of wrk's p99 latency. wrk shares the CPUs with the server under test; absolute numbers
depend on the machine, ratios less so. hypercorn closes a keep-alive connection after 1000
requests (``keep_alive_max_requests``): wrk reconnects, which is part of its cost at defaults.

**Protections (not timed).** :data:`PROTECTIONS` says, per server, which of GuardedProtocol's
protections it offers out of the box and by which option (each checked against the installed
version's ``--help`` or source), and :func:`probe` sends each running server a few malformed or
oversized heads at its defaults and records the status it answers (or that it closed).

Run (a few minutes; results go to ``--out``, a table to stdout)::

    .venv/bin/python benchmarks/servers.py --venv /tmp/servers/venv [--seconds 3] [--rounds 3]
"""

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "benchmarks"):  # service, and peers beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from peers import attention  # noqa: E402

# --- the app: pure ASGI, so that only the server differs between the rows ---------------------

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HEALTHY = b'{"status":"ok"}'
NOT_FOUND = b'{"detail":"Not Found"}'


def answer_attention(body: bytes) -> bytes:
    """The 3-token attention of a JSON body (x, w_q, w_k, w_v, weight_layout) as orjson bytes."""
    request = orjson.loads(body)
    x, w_q, w_k, w_v = (
        np.asarray(request[n], dtype=np.float64) for n in ("x", "w_q", "w_k", "w_v")
    )
    if request.get("weight_layout") == "out_in":
        w_q, w_k, w_v = w_q.T, w_k.T, w_v.T
    return orjson.dumps(attention(x, w_q, w_k, w_v), option=orjson.OPT_SERIALIZE_NUMPY)


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def app(scope: Message, receive: Receive, send: Send) -> None:
    """``GET /healthz`` and ``POST /attention``; the lifespan protocol, answered at once."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    method, path = scope["method"], scope["path"]
    if method == "GET" and path == "/healthz":
        await _respond(send, 200, HEALTHY)
    elif method == "POST" and path == "/attention":
        await _respond(send, 200, answer_attention(await _read_body(receive)))
    else:
        await _read_body(receive)
        await _respond(send, 404, NOT_FOUND)


# --- the servers ------------------------------------------------------------------------------

SCRIPT = Path(__file__).resolve()
TARGET = "benchmarks.servers:app"
GUARDED = "service.http.connection:GuardedProtocol"
STOCK = "uvicorn httptools (stock)"


def serve_uvicorn(http: str, port: int) -> None:
    """One uvicorn worker in this process, launched as ``python -m service`` launches the
    service (service/__main__.py), with ``http`` as the HTTP protocol."""
    import uvicorn

    uvicorn.run(
        TARGET,
        host="127.0.0.1",
        port=port,
        http=http,
        loop="uvloop",
        ws="none",
        server_header=False,
        access_log=False,
        proxy_headers=True,
        log_level="warning",
    )


@dataclass
class Server:
    """A server under test: how to start it, and what it measured."""

    name: str
    argv: Callable[[str, int], list[str]]  # (python, port) → the command line
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    failure: str | None = None
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # endpoint → wrk runs
    probes: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _uvicorn(http: str) -> Callable[[str, int], list[str]]:
    return lambda py, port: [py, str(SCRIPT), "--uvicorn-http", http, "--port", str(port)]


def _hypercorn(worker: str) -> Callable[[str, int], list[str]]:
    return lambda py, port: [
        py,
        *f"-m hypercorn -w 0 -k {worker} -b 127.0.0.1:{port} --log-level warning".split(),
        TARGET,
    ]


def _granian(loop: str) -> Callable[[str, int], list[str]]:
    options = (
        "--interface asgi --host 127.0.0.1 --workers 1 --runtime-threads 1 "
        f"--loop {loop} --http 1 --no-ws --log-level warning"
    )
    return lambda py, port: [py, "-m", "granian", *options.split(), "--port", str(port), TARGET]


def servers() -> list[Server]:
    return [
        Server(STOCK, _uvicorn("httptools")),
        Server("uvicorn GuardedProtocol", _uvicorn(GUARDED)),
        Server("uvicorn h11", _uvicorn("h11")),
        Server("hypercorn asyncio", _hypercorn("asyncio")),
        Server("hypercorn uvloop", _hypercorn("uvloop")),
        Server("granian asyncio", _granian("asyncio")),
        Server("granian uvloop", _granian("uvloop")),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(cpus())
    env["PYTHONPATH"] = str(ROOT)
    env.pop("VIRTUAL_ENV", None)
    return env


def start(server: Server, python: str, logs: Path) -> None:
    server.port = free_port()
    server.log = logs / (re.sub(r"\W+", "-", server.name).strip("-") + ".log")
    with server.log.open("wb") as log:
        server.process = subprocess.Popen(
            server.argv(python, server.port),
            cwd=ROOT,
            env=server_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: granian's worker goes with it
        )


def wait_ready(server: Server, timeout: float = 60.0) -> None:
    """Until /healthz answers; on failure, :attr:`Server.failure` says why."""
    assert server.process is not None and server.log is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log.read_text(errors="replace").strip().splitlines()[-3:]
            server.failure = f"exited with {server.process.returncode}: " + " | ".join(tail)
            return
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(server.base + "/healthz", timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.2)
    server.failure = f"no answer on /healthz within {timeout:g} s"


def stop(server: Server) -> None:
    """SIGTERM, then SIGKILL, to the process group this script started for the server."""
    process = server.process
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)
    with contextlib.suppress(ProcessLookupError):  # a worker left behind by its supervisor
        os.killpg(process.pid, signal.SIGKILL)


# --- checks -----------------------------------------------------------------------------------


def reference(body: dict[str, Any]) -> dict[str, Any]:
    """The NumPy result for ``body``, computed in this process."""
    arrays: dict[str, Any] = orjson.loads(answer_attention(orjson.dumps(body)))
    return arrays


def check(server: Server, body: dict[str, Any], expected: dict[str, Any]) -> None:
    """The /healthz answer and the POST answer to 1e-12; :attr:`Server.failure` otherwise."""
    try:
        with urllib.request.urlopen(server.base + "/healthz", timeout=10) as r:
            health = orjson.loads(r.read())
        request = urllib.request.Request(
            server.base + "/attention",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            answer = orjson.loads(r.read())
    except (OSError, ValueError) as error:
        server.failure = f"check failed: {error!r}"
        return
    if health != {"status": "ok"}:
        server.failure = f"/healthz answered {health!r}"
        return
    if set(answer) != set(expected):
        server.failure = f"/attention answered the keys {sorted(answer)}"
        return
    for name, value in expected.items():
        got, want = np.asarray(answer[name], dtype=np.float64), np.asarray(value, np.float64)
        if got.shape != want.shape or not np.all(np.abs(got - want) <= 1e-12):
            server.failure = f"/attention's {name} differs from NumPy's: {answer[name]} vs {value}"
            return


# --- load -------------------------------------------------------------------------------------

_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS_MS[unit]


def post_script(body: dict[str, Any], folder: Path) -> Path:
    """A wrk Lua script that POSTs ``body`` as JSON (a long bracket string: no escaping)."""
    text = orjson.dumps(body).decode()
    assert "]==]" not in text
    path = folder / "post.lua"
    path.write_text(
        f'wrk.method = "POST"\nwrk.body = [==[{text}]==]\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return path


def wrk(url: str, seconds: float, script: Path | None) -> dict[str, Any]:
    """One ``wrk -t2 -c8`` run: requests/s, p99 latency (ms), non-2xx answers, socket errors."""
    command = ["wrk", "-t2", "-c8", f"-d{seconds:g}s", "--latency"]
    command += ["-s", str(script)] if script is not None else []
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if rps is None or p99 is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return {
        "rps": float(rps.group(1)),
        "p99_ms": _ms(p99.group(1)),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": sum(int(n) for n in errors.groups()) if errors else 0,
    }


ENDPOINTS = ("healthz", "attention")


def measure(
    running: list[Server], seconds: float, rounds: int, script: Path, warmup: float = 1.0
) -> None:
    """Warm-up, then ``rounds`` rounds over every server, the order rotating."""
    paths = {"healthz": ("/healthz", None), "attention": ("/attention", script)}
    for server in running:
        for endpoint in ENDPOINTS:
            path, lua = paths[endpoint]
            wrk(server.base + path, warmup, lua)
            server.runs[endpoint] = []
    for r in range(rounds):
        order = running[r % len(running) :] + running[: r % len(running)]
        for server in order:
            for endpoint in ENDPOINTS if r % 2 == 0 else ENDPOINTS[::-1]:
                path, lua = paths[endpoint]
                run = wrk(server.base + path, seconds, lua)
                server.runs[endpoint].append(run)
                print(
                    f"  round {r + 1}/{rounds} {server.name:<26} {endpoint:<9} "
                    f"{run['rps']:>9.0f} req/s  p99 {run['p99_ms']:.2f} ms",
                    flush=True,
                )


def median(server: Server, endpoint: str, key: str) -> float:
    return float(statistics.median(run[key] for run in server.runs[endpoint]))


def clean(server: Server) -> bool:
    return all(
        run["non_2xx"] == 0 and run["socket_errors"] == 0
        for runs in server.runs.values()
        for run in runs
    )


# --- probes of the protections at each server's defaults (not timed) ---------------------------


def _status(port: int, request: bytes, timeout: float = 5.0) -> str:
    """The status code a server answers ``request`` with, or what happened instead."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(request)
        except OSError as error:  # it closed while the request was still going out
            sent = f"closed while sending ({type(error).__name__})"
        else:
            sent = ""
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            return f"no answer in {timeout:g} s"
        except OSError as error:
            return sent or f"{type(error).__name__}"
    line = data.split(b"\r\n", 1)[0].split()
    if len(line) >= 2 and line[0].startswith(b"HTTP/"):
        return line[1].decode()
    return sent or "closed, no answer"


def _head(path: str = "/healthz", method: str = "GET", fields: list[str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", *(fields if fields is not None else ["Host: a"])]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


CHUNKED_BODY = b"2\r\n{}\r\n0\r\n\r\n"
PROBES: dict[str, bytes] = {
    "head of 64 KiB": _head(fields=["Host: a", "X-Pad: " + "a" * 65536]),
    "head of 1 MiB": _head(fields=["Host: a", "X-Pad: " + "a" * (1 << 20)]),
    "150 header fields": _head(fields=["Host: a", *(f"X-F{i}: 1" for i in range(150))]),
    "two Host fields": _head(fields=["Host: a", "Host: b"]),
    "no Host (HTTP/1.1)": _head(fields=[]),
    "Transfer-Encoding: gzip, chunked": _head(
        "/probe", "POST", ["Host: a", "Transfer-Encoding: gzip, chunked"]
    )
    + CHUNKED_BODY,
    "Transfer-Encoding: gzip": _head("/probe", "POST", ["Host: a", "Transfer-Encoding: gzip"])
    + b"{}",
}


def probe(server: Server) -> None:
    """Each probe on a fresh connection: the status answered (404 from /probe, or 200 from
    /healthz: the request reached the app), else what happened."""
    for name, request in PROBES.items():
        try:
            server.probes[name] = _status(server.port, request)
        except OSError as error:
            server.probes[name] = f"{type(error).__name__}"


# --- what each server offers out of the box, against GuardedProtocol's protections -------------

PROTECTION_NAMES = [
    "head bytes cap → 431",
    "header count cap → 431",
    "head deadline → 408",
    "body minimum rate → 408",
    "answer-reading minimum rate",
    "connection cap → 503 + Retry-After",
    "exactly one Host → 400",
    "only chunked transfer coding → 501",
    "lingering close after an early answer",
    "head written with the first body bytes",
]

# One cell per (protection, server): the option (or mechanism) and what it does at its default,
# each checked in the installed version: uvicorn 0.54.0 (--help; protocols/http/*_impl.py,
# flow_control.py), hypercorn 0.18.0 (--help; config.py, asyncio/tcp_server.py, protocol/h11.py),
# granian 2.8.9 (--help; its accept loop in src/workers.rs). Status codes as PROBES saw them;
# deadlines by a head left incomplete (quiet, and trickled a byte per 0.5 s): hypercorn closes at
# 5 s, granian at its --http1-header-read-timeout, both without an answer, uvicorn never; written
# segments by strace of one GET /healthz. "—": nothing in the server for it.
PROTECTIONS: dict[str, dict[str, str]] = {
    "uvicorn GuardedProtocol": {
        "head bytes cap → 431": "ATTENTION_MAX_HEADER_BYTES (32 KiB)",
        "header count cap → 431": "ATTENTION_MAX_HEADERS (100)",
        "head deadline → 408": "ATTENTION_HEADER_TIMEOUT_SECONDS (10 s)",
        "body minimum rate → 408": "ATTENTION_MIN_TRANSFER_RATE per ATTENTION_BODY_TIMEOUT_SECONDS",
        "answer-reading minimum rate": "ATTENTION_SEND_TIMEOUT_SECONDS, ATTENTION_ANSWER_TIMEOUT_SECONDS",
        "connection cap → 503 + Retry-After": "ATTENTION_MAX_CONNECTIONS (1000 per worker)",
        "exactly one Host → 400": "yes",
        "only chunked transfer coding → 501": "yes",
        "lingering close after an early answer": "yes (≤ 10 s, ends after 1 s idle)",
        "head written with the first body bytes": "yes (bodies ≤ 64 KiB; 1 write)",
    },
    STOCK: {
        "head bytes cap → 431": "— (a 1 MiB head was served)",
        "header count cap → 431": "— (150 fields served)",
        "head deadline → 408": "— (--timeout-keep-alive runs only after an answer)",
        "body minimum rate → 408": "—",
        "answer-reading minimum rate": "— (flow control pauses the app, no deadline)",
        "connection cap → 503 + Retry-After": "partly: --limit-concurrency → 503, no Retry-After",
        "exactly one Host → 400": "— (two Hosts and none served)",
        "only chunked transfer coding → 501": "partly: llhttp → 400 unless chunked is last",
        "lingering close after an early answer": "— (reads and drops the rest, unbounded)",
        "head written with the first body bytes": "— (2 writes)",
    },
    "uvicorn h11": {
        "head bytes cap → 431": "partly: --h11-max-incomplete-event-size (16 KiB) → 400, only on a head split across reads",
        "header count cap → 431": "— (only the byte cap)",
        "head deadline → 408": "— (--timeout-keep-alive runs only after an answer)",
        "body minimum rate → 408": "—",
        "answer-reading minimum rate": "— (flow control pauses the app, no deadline)",
        "connection cap → 503 + Retry-After": "partly: --limit-concurrency → 503, no Retry-After",
        "exactly one Host → 400": "yes (h11)",
        "only chunked transfer coding → 501": "partly: h11 refuses, uvicorn answers 400",
        "lingering close after an early answer": "— (reads and drops the rest, unbounded)",
        "head written with the first body bytes": "— (2 writes)",
    },
    "hypercorn": {
        "head bytes cap → 431": "yes: h11_max_incomplete_size (config file only, 16 KiB)",
        "header count cap → 431": "— (only the byte cap)",
        "head deadline → 408": "partly: --keep-alive (keep_alive_timeout, 5 s) → close, no 408",
        "body minimum rate → 408": "— (--read-timeout: per read, closes, off by default)",
        "answer-reading minimum rate": "— (writer.drain() without a deadline)",
        "connection cap → 503 + Retry-After": "— (--backlog only)",
        "exactly one Host → 400": "yes (h11)",
        "only chunked transfer coding → 501": "yes (h11)",
        "lingering close after an early answer": "— (closes at once)",
        "head written with the first body bytes": "— (2 writes)",
    },
    "granian": {
        "head bytes cap → 431": "yes: --http1-buffer-size (408 KiB)",
        "header count cap → 431": "yes: hyper's fixed 100",
        "head deadline → 408": "partly: --http1-header-read-timeout (30 s) → close, no 408",
        "body minimum rate → 408": "—",
        "answer-reading minimum rate": "—",
        "connection cap → 503 + Retry-After": "partly: --backpressure (backlog/workers) stops accepting, no 503",
        "exactly one Host → 400": "— (two Hosts and none served)",
        "only chunked transfer coding → 501": "partly: hyper → 400 unless chunked is last",
        "lingering close after an early answer": "— (closes at once)",
        "head written with the first body bytes": "yes (1 writev)",
    },
}


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


# --- the side venv ----------------------------------------------------------------------------

CANDIDATES = ["hypercorn==0.18.0", "granian==2.8.9", "msgspec==0.22.0"]  # msgspec: validation.py
SHARED = ["uvicorn", "httptools", "uvloop", "h11", "numpy", "orjson"]


def ensure_venv(venv: Path, wheels: Path | None = None) -> str:
    """The side venv's python, the venv created and filled first when it lacks a server."""
    python = venv / "bin" / "python"
    probe_imports = [
        str(python),
        "-c",
        "import granian, hypercorn, msgspec, uvicorn, fastapi, uvloop",
    ]
    if python.exists() and subprocess.run(probe_imports, capture_output=True).returncode == 0:
        return str(python)
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"creating {venv} from {base} …", flush=True)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    links = ["--find-links", str(wheels)] if wheels is not None else []
    subprocess.run(
        [*pip, *links, "-r", str(ROOT / "requirements.lock"), *CANDIDATES], check=True, cwd=ROOT
    )
    return str(python)


def versions(python: str) -> dict[str, str]:
    """The versions of the shared libraries, the servers and Python under ``python``."""
    code = (
        "import importlib.metadata as m, json, platform\n"
        f"found = {{n: m.version(n) for n in {[*SHARED, 'hypercorn', 'granian']!r}}}\n"
        "print(json.dumps({**found, 'python': platform.python_version()}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    found: dict[str, str] = json.loads(out)
    return found


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{cpus()} CPUs, {model}"


# --- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--venv", type=Path, default=Path("/tmp/servers/venv"))
    parser.add_argument("--find-links", type=Path, help="a folder of wheels for pip, if any")
    parser.add_argument("--seconds", type=float, default=3.0, help="each wrk run (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all servers (3)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/servers/servers.json"))
    parser.add_argument("--uvicorn-http", help=argparse.SUPPRESS)  # internal: serve, see above
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.uvicorn_http:
        serve_uvicorn(args.uvicorn_http, args.port)
        return 0

    from service.wire.examples import I_AM_BATMAN

    python = ensure_venv(args.venv, args.find_links)
    side = versions(python)
    here = {n: importlib.metadata.version(n) for n in SHARED}
    mismatched = {n: (here[n], side[n]) for n in SHARED if here[n] != side[n]}
    print(f"machine: {machine()}; servers run under {python} ({side})")
    if mismatched:
        print(f"warning: the side venv's versions differ from this venv's: {mismatched}")
    expected = reference(I_AM_BATMAN)

    all_servers = servers()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.out.parent))  # logs, post.lua
    try:
        for server in all_servers:
            start(server, python, work)
        for server in all_servers:
            wait_ready(server)
            if server.failure is None:
                check(server, I_AM_BATMAN, expected)
            if server.failure is not None:
                print(f"left out: {server.name}: {server.failure}")
                stop(server)
        running = [s for s in all_servers if s.failure is None]
        if not any(s.name == STOCK for s in running):
            print("stock uvicorn did not start: no baseline")
            return 1
        print(
            f"measuring {len(running)} servers: wrk -t2 -c8 -d{args.seconds:g}s, "
            f"{args.rounds} rounds",
            flush=True,
        )
        measure(running, args.seconds, args.rounds, post_script(I_AM_BATMAN, work))
        for server in running:
            probe(server)
    finally:
        for server in all_servers:
            stop(server)

    stock = next(s for s in running if s.name == STOCK)
    base = {e: median(stock, e, "rps") for e in ENDPOINTS}
    rows, results = [], []
    for server in running:
        health, attn = (median(server, e, "rps") for e in ENDPOINTS)
        ok = clean(server)
        rows.append(
            [
                server.name,
                f"{health:,.0f}",
                f"{health / base['healthz']:.2f}",
                f"{attn:,.0f}",
                f"{attn / base['attention']:.2f}",
                f"{median(server, 'healthz', 'p99_ms'):.2f} / {median(server, 'attention', 'p99_ms'):.2f}",
                "ok" if ok else "ERRORS",
            ]
        )
        results.append(
            {
                "server": server.name,
                "command": server.argv(python, server.port),
                "healthz_rps": health,
                "attention_rps": attn,
                "healthz_ratio": health / base["healthz"],
                "attention_ratio": attn / base["attention"],
                "healthz_p99_ms": median(server, "healthz", "p99_ms"),
                "attention_p99_ms": median(server, "attention", "p99_ms"),
                "clean": ok,
                "runs": server.runs,
                "probes": server.probes,
            }
        )
    header = ["server", "healthz req/s", "÷ stock", "attention req/s", "÷ stock"]
    header += ["p99 ms healthz / attention", "wrk"]
    print(f"\n{machine()}; wrk -t2 -c8 -d{args.seconds:g}s; medians of {args.rounds} rounds\n")
    print(markdown(header, rows))
    print("\nProbed at each server's defaults (status answered; 200/404 = reached the app):\n")
    probed = [[p, *(s.probes[p] for s in running)] for p in PROBES]
    print(markdown(["probe", *(s.name for s in running)], probed))
    columns = list(PROTECTIONS)
    print("\nGuardedProtocol's protections out of the box (option or mechanism):\n")
    offered = [[p, *(PROTECTIONS[c][p] for c in columns)] for p in PROTECTION_NAMES]
    print(markdown(["protection", *columns], offered))

    report = {
        "machine": machine(),
        "python": python,
        "versions": side,
        "version_mismatches": mismatched,
        "wrk": f"wrk -t2 -c8 -d{args.seconds:g}s --latency",
        "rounds": args.rounds,
        "servers": results,
        "left_out": {s.name: s.failure for s in all_servers if s.failure is not None},
        "logs": str(work),
        "protections": PROTECTIONS,
    }
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwritten to {args.out}")
    return 0 if all(r["clean"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
