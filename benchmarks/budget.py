"""Where a small request's time goes: the CPU microseconds of each stage of P2's 3-token
POST /attention (the I AM BATMAN example), from the connection to the access log line.

Timings of sub-millisecond work on a shared machine are noise, so the totals here are CPU time:

- **per stage, in context**: ``--requests`` requests through the ASGI app (after as many to
  warm up) with each stage's function wrapped, its exclusive time read from the monotonic
  clock (a CPU-clock read costs microseconds here, more than some stages): JSON parse,
  validation, the rules (fold, shapes, expected, include, limits), the plan, the engine
  (projections and attention), the summary, the steps, the rest of the outputs table (response
  assembly), the encoding, the access log line and the metrics; what is left of the request's
  time is the HTTP layers;
- **through the ASGI app** (middleware, routing, the compute endpoint, the response), not
  instrumented, in CPU time (``time.thread_time_ns``), for the request and for GET /healthz;
- **on a real server** (``python -m service``, one worker, as ``make bench`` starts it) under
  ``wrk -t2 -c8``: the server process's CPU time (``/proc``) divided by the requests wrk
  completed, for the request and /healthz, and for the lean FastAPI peer of row S1
  (benchmarks/peers.py) on the same body. What the server spends that the ASGI app does not is
  the connection: uvicorn's protocol (the service's GuardedProtocol), the event loop and the
  socket system calls.

    .venv/bin/python benchmarks/budget.py [--seconds 4] [--out benchmarks/results/budget.json]

Needs wrk for the server part (skipped without it). Prints a table; writes JSON.
"""

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from starlette.types import Message  # noqa: E402

from harness.live import free_port, http_json, start_server  # noqa: E402
from service.trace import steps  # noqa: E402
from service.wire.examples import I_AM_BATMAN  # noqa: E402


class Stages:
    """Time per stage, exclusive: a stage called inside another pauses the outer one. The
    marks read the monotonic clock (tens of ns a read; the thread's CPU clock is a system
    call of microseconds here, which would swamp the stages)."""

    def __init__(self) -> None:
        self.spent: dict[str, int] = {}
        self.stack: list[list[int]] = []  # [started, time of the stages inside it]

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [time.perf_counter_ns(), 0]
            self.stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
                took = time.perf_counter_ns() - frame[0]
                self.spent[stage] = self.spent.get(stage, 0) + took - frame[1]
                if self.stack:
                    self.stack[-1][1] += took

        return timed


STAGES = [  # (stage, what it covers); "HTTP layers" is what is left of the request's time
    ("parse", "orjson.loads of the body"),
    ("validation", "pydantic: the request model, its lists to arrays"),
    ("rules", "fold, shapes, expected, include, limits"),
    ("plan", "weights converted, arrays drawn"),
    ("engine", "Q, K, V projections; scaled dot-product attention"),
    ("summary", "top key and entropy per row"),
    ("steps", "the steps' words and shapes"),
    ("outputs", "the outputs table: the values, conventions, the body's dict"),
    ("encode", "orjson of the response body"),
    ("log + metrics", "the access line (to a file) and four metrics"),
    ("HTTP layers", "FastAPI's outer layers, the middleware, the request and response objects"),
]


def instrument(stages: Stages) -> None:
    """Wrap each stage's function where the request path looks it up."""
    from service import trace
    from service.http import doors, middleware, routes
    from service.trace import compute
    from service.wire import parse

    for module, name, stage in (
        (trace, "plan_attention", "plan"),  # trace.run calls them by name
        (trace, "run_attention", "outputs"),  # less what it calls
        (parse, "load_json", "parse"),
        (parse, "parse", "validation"),  # less load_json inside it
        (trace, "admit", "rules"),
        (compute, "project_qkv", "engine"),
        (compute, "_attend", "engine"),
        (compute, "_summary", "summary"),
        (steps, "attention_steps", "steps"),
        (routes, "encode_whole", "encode"),
        (middleware, "record", "log + metrics"),
    ):
        setattr(module, name, stages.wrap(stage, getattr(module, name)))
    doors.checked.__globals__["parse"] = parse.parse  # doors imported parse by name


def asgi_us(requests: int, stages: Stages | None = None) -> dict[str, float]:
    """CPU µs per request through the whole ASGI app (no server), /healthz and the request:
    the mean of ``requests`` after as many to warm up. With ``stages``, they are timed too."""
    from service.main import app

    raw = orjson.dumps(I_AM_BATMAN)

    async def one(path: str, method: str, body: bytes) -> None:
        headers = [(b"host", b"x"), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "root_path": "", "query_string": b"", "headers": headers,
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}  # fmt: skip
        sent = False
        statuses: list[int] = []

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(scope, receive, send)
        assert statuses == [200], statuses

    async def measure(path: str, method: str, body: bytes) -> float:
        for _ in range(requests):
            await one(path, method, body)
        if stages is not None:
            stages.spent.clear()
        clock = time.thread_time_ns if stages is None else time.perf_counter_ns
        start = clock()
        for _ in range(requests):
            await one(path, method, body)
        return (clock() - start) / requests / 1e3

    async def both() -> dict[str, float]:
        async with app.router.lifespan_context(app):
            healthz = await measure("/healthz", "GET", b"")
            return {"healthz": healthz, "attention": await measure("/attention", "POST", raw)}

    return asyncio.run(both())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_requests(url: str, seconds: int, script: str | None) -> int:
    cmd = ["wrk", "-t2", "-c8", f"-d{seconds}s", url] + (["-s", script] if script else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "Non-2xx" not in out and "Socket errors" not in out, out
    return int(next(line.split()[0] for line in out.splitlines() if "requests in" in line))


def server_us(pid: int, base: str, seconds: int, script: str) -> dict[str, float]:
    """The server process's CPU µs per request under wrk, for /healthz and the POST."""
    out = {}
    for name, url, lua in (("healthz", base + "/healthz", None),
                           ("attention", base + "/attention", script)):  # fmt: skip
        wrk_requests(url, 1, lua)  # warm
        before = cpu_seconds(pid)
        done = wrk_requests(url, seconds, lua)
        out[name] = (cpu_seconds(pid) - before) / done * 1e6
    return out


def lean_peer_us(seconds: int, script: str) -> float:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.peers:lean", "--port", str(port),
           "--workers", "1", "--log-level", "warning"]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if http_json(base + "/attention", I_AM_BATMAN)[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "the peer did not start"
                time.sleep(0.2)
            wrk_requests(base + "/attention", 1, script)
            before = cpu_seconds(proc.pid)
            done = wrk_requests(base + "/attention", seconds, script)
            return (cpu_seconds(proc.pid) - before) / done * 1e6
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def post_script(folder: Path) -> str:
    body = json.dumps(I_AM_BATMAN).replace("\\", "\\\\").replace('"', '\\"')
    path = folder / "post.lua"
    path.write_text(
        f'wrk.method = "POST"\nwrk.body = "{body}"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return str(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=4, help="each wrk run")
    parser.add_argument("--requests", type=int, default=3000, help="timed in process")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "budget.json"))
    args = parser.parse_args(argv)
    # the access line goes to a file, as a deployment's would (not a terminal)
    with tempfile.TemporaryDirectory() as tmp:
        handler = logging.FileHandler(Path(tmp) / "access.log")
        access = logging.getLogger("service.access")
        access.handlers[:] = [handler]
        access.setLevel(logging.INFO)
        access.propagate = False
        plain = asgi_us(args.requests)
        stages = Stages()
        instrument(stages)
        timed = asgi_us(args.requests, stages)
        server: dict[str, float] = {}
        peer = None
        if shutil.which("wrk"):
            script = post_script(Path(tmp))
            proc, base = start_server(workers=1)
            try:
                server = server_us(proc.pid, base, args.seconds, script)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            peer = lean_peer_us(args.seconds, script)
    per_request = {k: v / args.requests / 1e3 for k, v in stages.spent.items()}
    per_request["HTTP layers"] = timed["attention"] - sum(per_request.values())
    rows: list[tuple[str, float, str]] = [(name, per_request[name], what) for name, what in STAGES]
    rows.append(("POST /attention, instrumented", timed["attention"], "the stages above, added up"))
    rows.append(("POST /attention", plain["attention"], "the ASGI app, not instrumented"))
    rows.append(("GET /healthz", plain["healthz"], "the ASGI app: middleware, FastAPI's router"))
    if server:
        for name in ("attention", "healthz"):
            rows.append((f"server: {name}", server[name],
                         "the server process's CPU per request under wrk -t2 -c8"))  # fmt: skip
    if peer is not None:
        rows.append(("lean peer: POST /attention", peer, "its server's CPU per request, same wrk"))
    for name, us, what in rows:
        print(f"{name:40s} {us:8.1f} µs  {what}")
    Path(args.out).write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "rows": [{"stage": n, "cpu_us": round(us, 1), "what": w} for n, us, w in rows],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
