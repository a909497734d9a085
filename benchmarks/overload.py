"""Overload benchmark: many large requests at once against a memory budget, as operators hit it.

Starts a real server (`python -m service`, 2 workers by default) whose workers get the memory
budget they would derive inside a container with `--memory-limit-gb` of memory (there is no
container here: the budget is passed as ATTENTION_MEMORY_BUDGET_BYTES). Then fires
`--concurrency` large POST /attention requests at once (L=2048, generated inputs: ~13 M numbers
computed, ~260 MB of JSON each), each on its own connection, and while they run sends a small
request every 100 ms, GET /healthz every 50 ms and GET /metrics every 500 ms, and samples the
server's resident memory (the parent and every worker) every 100 ms.

With `--bodies N` (default 16; 0: none) it also sends, at the same moment, N POST /attention
requests whose bodies are large to parse but cheap to compute ("large bodies"): ≈28 MiB of JSON
each, under the default 32 MiB body limit (x a batch [256][920][8] and context [256][4][8] of
random floats printed with 12 significant digits, 8×2 weights, include ["output"]: ≈4.5 M
numbers computed). One body is built once, validated once here (its parse time is reported)
and sent on every connection. `--bodies-only` sends the large bodies without the large
requests, to read the effect of parsing on the probes alone.

Reports each group's statuses (200, 503 with Retry-After, anything else) and latency, the
probes' latency during the overload (against the targets /healthz p99 ≤ 100 ms and max < 1 s,
/metrics max < 1 s: shown, not part of the exit code), peak RSS against budget × workers and
against the simulated limit, and the admission counters from /metrics; then checks that a small
request right after succeeds. Prints a table, writes benchmarks/results/overload.json, and exits
1 if a large request or a large body got anything but 200 or 503 with Retry-After, if no large
request got 200 (with --bodies-only: no large body), or if the small request after failed.
Sends traffic only to 127.0.0.1 and stops by itself.

    .venv/bin/python benchmarks/overload.py [--concurrency 48] [--bodies 16] [--bodies-only]
        [--workers 2] [--memory-limit-gb 4] [--seconds 0] [--quick]
"""

import argparse
import contextlib
import http.client
import json
import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.live import start_server  # noqa: E402
from service.config import Settings  # noqa: E402
from service.http.budget import cost_bytes, worker_budget  # noqa: E402
from service.trace.limits import check_limits  # noqa: E402
from service.trace.rules import attention_shapes  # noqa: E402
from service.wire.examples import I_AM_BATMAN  # noqa: E402
from service.wire.schemas.requests import AttentionRequest  # noqa: E402

LARGE: dict[str, Any] = {"seq_len": 2048, "seed": 1, "d_model": 64, "d_k": 64}
JSON_HEADERS = {"Content-Type": "application/json"}
READ_CHUNK = 1 << 20  # the client keeps at most this much of a response at a time
PROBE_TIMEOUT = 60.0
MiB = 1 << 20
# a large body: cheap to compute, ≈28 MiB to parse (x is 235,520 rows of 8 numbers)
BODY_BATCH, BODY_ROWS, BODY_WIDTH = 256, 920, 8  # x [B][L][d_model]
BODY_CONTEXT_ROWS, BODY_D_K = 4, 2  # S keys per batch item (so B·L·S scores), weights d_model × 2
BODY_SIZE_RANGE = (27 * MiB, 29 * MiB)
PROBE_TARGETS = {"GET /healthz": (0.1, 1.0), "GET /metrics": (None, 1.0)}  # p99, max: seconds


@dataclass
class Outcome:
    """One large request: what came back and when."""

    kind: str  # "200", "503", or a failure: "503 without Retry-After", "status 500", "error: …"
    seconds: float  # from sending to the last byte (or the error)
    headers_seconds: float | None = None  # to the status line: queue wait + compute for a 200
    body_bytes: int = 0


@dataclass
class Probe:
    """A request sent on a fixed period during the overload, each on a new connection."""

    name: str
    method: str
    path: str
    period: float
    body: bytes | None = None
    latencies: list[float] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)  # time.monotonic() of each in latencies
    failures: list[str] = field(default_factory=list)


@dataclass
class MemorySampler:
    """RSS of the server process tree, sampled on a period from a thread."""

    pid: int
    period: float = 0.1
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds, bytes)
    peak_by_pid: dict[int, int] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    def sample(self) -> int:
        total = 0
        for pid in tree_pids(self.pid):
            rss = rss_bytes(pid)
            total += rss
            self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0), rss)
        self.samples.append((time.monotonic() - self.t0, total))
        return total

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.sample()
            stop.wait(self.period)

    def peak(self, start: float = 0.0) -> int:
        return max((b for t, b in self.samples if t >= start), default=0)


def tree_pids(root: int) -> list[int]:
    """The process and all its descendants (children of every thread, recursively)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError):  # the process or thread is gone
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return pids


def rss_bytes(pid: int) -> int:
    """VmRSS of one process in bytes (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class LargeBody:
    """The large-body request: its bytes (built once, sent on every connection) and what it
    costs."""

    body: bytes
    shape: dict[str, list[int]]
    computed: int  # numbers computed, intermediates included
    parse_seconds: float  # orjson + validation, once, in this process, while idle


def matrix_format(rows: int, width: int) -> str:
    """A %-format for one matrix [rows][width] of numbers with 12 significant digits."""
    row = "[" + ",".join(["%.12g"] * width) + "]"
    return "[" + ",".join([row] * rows) + "]"


def large_body(settings: Settings) -> LargeBody:
    """Build the ≈28 MiB body once, then parse and check it as the service does, so that a
    change in the limits shows here, before any traffic is sent."""
    rng = np.random.default_rng(7)
    arrays = {
        "x": rng.standard_normal((BODY_BATCH, BODY_ROWS, BODY_WIDTH)),
        "context": rng.standard_normal((BODY_BATCH, BODY_CONTEXT_ROWS, BODY_WIDTH)),
        **{w: rng.standard_normal((BODY_WIDTH, BODY_D_K)) for w in ("w_q", "w_k", "w_v")},
    }
    parts = []
    for name, a in arrays.items():
        fmt = matrix_format(*a.shape[-2:])
        if a.ndim == 3:
            fmt = "[" + ",".join([fmt] * a.shape[0]) + "]"
        parts.append(f'"{name}":' + fmt % tuple(a.ravel().tolist()))
    body = ("{" + ",".join(parts) + ',"include":["output"]}').encode()
    low, high = BODY_SIZE_RANGE
    if not low <= len(body) <= high or len(body) > settings.max_body_bytes:
        sys.exit(f"the large body is {len(body):,} bytes: not within {low:,}–{high:,} and under "
                 f"the body limit {settings.max_body_bytes:,}")  # fmt: skip
    start = time.perf_counter()
    request = AttentionRequest.model_validate(orjson.loads(body))
    parse_seconds = time.perf_counter() - start
    computed = check_limits(attention_shapes(request), request.include, settings)
    shape = {name: list(a.shape) for name, a in arrays.items()}
    return LargeBody(body, shape, computed, parse_seconds)


def drain(response: http.client.HTTPResponse, buffer: bytearray) -> tuple[int, int | None]:
    """Read the body to its end, a chunk at a time; return its size and its last byte."""
    total, last = 0, None
    while n := response.readinto(buffer):
        total += n
        last = buffer[n - 1]
    return total, last


def large_request(port: int, body: bytes, timeout: float) -> Outcome:
    """POST one large request on a new connection and read the answer fully, discarding it."""
    buffer = bytearray(READ_CHUNK)
    start = time.perf_counter()
    headers_at = None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/attention", body, JSON_HEADERS)
        response = conn.getresponse()
        headers_at = time.perf_counter() - start
        size, last = drain(response, buffer)
        status = response.status
        if status == 200:
            kind = "200" if last == ord("}") else "200 with a truncated body"
        elif status == 503:
            kind = "503" if response.getheader("Retry-After") else "503 without Retry-After"
        else:
            kind = f"status {status}"
    except (OSError, http.client.HTTPException) as err:
        kind, size = f"error: {type(err).__name__}", 0
    finally:
        conn.close()
    return Outcome(kind, time.perf_counter() - start, headers_at, size)


def large_client(
    port: int,
    body: bytes,
    timeout: float,
    gate: threading.Barrier,
    deadline: float | None,
    out: list[Outcome],
    lock: threading.Lock,
) -> None:
    """One connection's worth of load: one request, or (with a deadline) requests until the
    deadline, waiting Retry-After after a 503 as a well-behaved client does."""
    gate.wait()
    while True:
        outcome = large_request(port, body, timeout)
        with lock:
            out.append(outcome)
        if deadline is None or time.monotonic() >= deadline:
            return
        if outcome.kind == "503":
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return


def probe_once(port: int, probe: Probe) -> tuple[float, int, bytes]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        conn.request(probe.method, probe.path, probe.body, JSON_HEADERS if probe.body else {})
        response = conn.getresponse()
        data = response.read()
        return time.perf_counter() - start, response.status, data
    finally:
        conn.close()


def run_probe(
    port: int, probe: Probe, stop: threading.Event, on_body: Callable[[bytes], None] | None
) -> None:
    """Send the probe every period (the next one at once if one took longer) until stopped."""
    next_at = time.monotonic()
    while not stop.is_set():
        sent = time.monotonic()
        try:
            seconds, status, data = probe_once(port, probe)
            if status == 200:
                probe.latencies.append(seconds)
                probe.sent_at.append(sent)
                if on_body is not None:
                    on_body(data)
            else:
                probe.failures.append(f"status {status} after {seconds:.3f} s")
        except (OSError, http.client.HTTPException) as err:
            probe.failures.append(f"{type(err).__name__}: {err}"[:200])
        next_at = max(next_at + probe.period, time.monotonic())
        stop.wait(next_at - time.monotonic())


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus exposition text to {'name{labels}': value} (comments skipped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


def admission(metrics: dict[str, float]) -> dict[str, float]:
    """The admission series from a /metrics scrape."""
    keep = (
        "attention_admitted_total",
        "attention_queued_total",
        "attention_rejected_total",
        "attention_waiting",
        "attention_budget_bytes",
        "attention_budget_in_use_bytes",
        "attention_queue_wait_seconds_count",
        "attention_queue_wait_seconds_sum",
    )
    return {k: v for k, v in metrics.items() if k.startswith(keep)}


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """One group's statuses and latencies, for the table and the JSON."""
    kinds = Counter(o.kind for o in outcomes)
    served = [o for o in outcomes if o.kind == "200"]
    return {
        "sent": len(outcomes),
        "statuses": dict(kinds),
        "ok_200": kinds["200"],
        "refused_503_with_retry_after": kinds["503"],
        "failures": sum(n for k, n in kinds.items() if k not in ("200", "503")),
        "latency_200": latency_ms([o.seconds for o in served]),
        "headers_200": latency_ms([o.headers_seconds for o in served if o.headers_seconds]),
        "latency_503": latency_ms([o.seconds for o in outcomes if o.kind == "503"]),
        "bytes_200": sorted({o.body_bytes for o in served}),
    }


def slowest(probe: Probe, start: float, n: int = 5) -> list[tuple[float, float]]:
    """The n slowest answers: (sent at, seconds from the overload's start; latency, ms)."""
    pairs = sorted(zip(probe.sent_at, probe.latencies, strict=True), key=lambda p: -p[1])[:n]
    return [(round(at - start, 2), round(s * 1e3, 1)) for at, s in pairs]


def targets(probe: Probe) -> dict[str, Any]:
    """The issue's targets for this probe, and whether they held (not part of the exit code)."""
    if probe.name not in PROBE_TARGETS:
        return {}
    p99, top = PROBE_TARGETS[probe.name]
    held = bool(probe.latencies) and not probe.failures and max(probe.latencies) < top
    if p99 is not None:
        held = held and (percentile(probe.latencies, 99) or 0.0) <= p99
    wanted = ([f"p99 ≤ {p99 * 1e3:.0f} ms"] if p99 is not None else []) + [f"max < {top:g} s"]
    return {"target": ", ".join(wanted), "target_held": held}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n·q/100)
    return ordered[min(len(ordered), int(rank)) - 1]


def latency_ms(values: list[float]) -> dict[str, float | int | None]:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1e3, 1)

    return {
        "count": len(values),
        "p50_ms": ms(percentile(values, 50)),
        "p99_ms": ms(percentile(values, 99)),
        "max_ms": ms(max(values, default=None)),
    }


def mib(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=48, help="large requests at once")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--memory-limit-gb", type=float, default=4.0, help="the simulated container limit, GiB"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="0 (default): one wave of --concurrency requests; otherwise each connection keeps "
        "sending large requests for this long (after a 503 it waits Retry-After)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="socket timeout of a large request, s"
    )
    parser.add_argument(
        "--bodies",
        type=int,
        default=16,
        help="large bodies (≈28 MiB of JSON, cheap to compute) sent with the large requests; 0: none",
    )
    parser.add_argument(
        "--bodies-only",
        action="store_true",
        help="send only the large bodies, no large requests: the effect of parsing alone",
    )
    parser.add_argument("--quick", action="store_true", help="concurrency 8, for smoke runs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overload.json"))
    args = parser.parse_args()
    concurrency: int = 0 if args.bodies_only else 8 if args.quick else args.concurrency
    bodies: int = args.bodies
    if args.bodies_only and bodies <= 0:
        parser.error("--bodies-only needs --bodies above 0")
    workers: int = args.workers
    limit = int(args.memory_limit_gb * 2**30)

    budget = worker_budget(Settings(workers=workers), limit=limit)
    request = AttentionRequest.model_validate(LARGE)
    computed = check_limits(attention_shapes(request), request.include, Settings())
    cost = cost_bytes(computed)
    print(
        f"memory limit {mib(limit)} (simulated), {workers} workers: budget {mib(budget)} per "
        f"worker ({budget:,} bytes), {mib(budget * workers)} in all"
    )
    print(
        f"large request: {computed:,} numbers computed, cost {mib(cost)}: "
        f"{budget // cost} fit in one worker's budget at once; {concurrency} sent at once"
    )
    big = large_body(Settings()) if bodies > 0 else None
    if big is not None:
        print(
            f"large body: {len(big.body):,} bytes ({len(big.body) / MiB:.1f} MiB), "
            + ", ".join(f"{k} {'×'.join(map(str, v))}" for k, v in big.shape.items())
            + f"; {big.computed:,} numbers computed, cost {mib(cost_bytes(big.computed))}; "
            f"parses in {big.parse_seconds:.2f} s here (orjson + validation, idle); "
            f"{bodies} sent at once" + (" with the large requests" if concurrency else "")
        )

    wall_start = time.monotonic()
    env = {**os.environ, "ATTENTION_MEMORY_BUDGET_BYTES": str(budget)}
    proc, base = start_server(workers=workers, env=env)
    port = int(base.rsplit(":", 1)[1])
    started_in = time.monotonic() - wall_start
    memory = MemorySampler(proc.pid)
    outcomes: list[Outcome] = []
    body_outcomes: list[Outcome] = []
    lock = threading.Lock()
    peaks = {"attention_budget_in_use_bytes": 0.0, "attention_waiting": 0.0}

    def watch_metrics(data: bytes) -> None:
        values = parse_metrics(data.decode())
        for name in peaks:
            peaks[name] = max(peaks[name], values.get(name, 0.0))

    small = Probe(
        "small POST /attention", "POST", "/attention", 0.1, json.dumps(I_AM_BATMAN).encode()
    )
    probes = [
        small,
        Probe("GET /healthz", "GET", "/healthz", 0.05),
        Probe("GET /metrics", "GET", "/metrics", 0.5),
    ]
    after: dict[str, Any] = {}
    final: dict[str, float] = {}
    try:
        probe_once(port, small)  # warm the small path once (small requests are never admitted)
        time.sleep(1.0)
        baseline = memory.sample()
        stop_memory = threading.Event()
        sampler = threading.Thread(target=memory.run, args=(stop_memory,), daemon=True)
        sampler.start()

        body = json.dumps(LARGE).encode()
        n_bodies, body_bytes = (bodies, big.body) if big is not None else (0, b"")
        gate = threading.Barrier(concurrency + n_bodies + 1)
        deadline: float | None = None  # with --seconds: when the connections stop sending
        stop_probes = threading.Event()
        probe_threads = [
            threading.Thread(
                target=run_probe,
                args=(port, p, stop_probes, watch_metrics if p.path == "/metrics" else None),
                daemon=True,
            )
            for p in probes
        ]
        overload_start = time.monotonic()
        if args.seconds > 0:
            deadline = overload_start + args.seconds
        clients = [
            threading.Thread(
                target=large_client,
                args=(port, body, args.timeout, gate, deadline, outcomes, lock),
                daemon=True,
            )
            for _ in range(concurrency)
        ] + [
            threading.Thread(
                target=large_client,
                args=(port, body_bytes, args.timeout, gate, deadline, body_outcomes, lock),
                daemon=True,
            )
            for _ in range(n_bodies)
        ]
        for t in [*clients, *probe_threads]:
            t.start()
        overload_offset = overload_start - memory.t0
        gate.wait()  # every large request and large body goes out at once
        for t in clients:
            t.join()
        overload_seconds = time.monotonic() - overload_start
        stop_probes.set()
        for t in probe_threads:
            t.join()

        try:  # right after: a small request must succeed
            seconds, status, data = probe_once(port, small)
            after = {"status": status, "ms": round(seconds * 1e3, 1), "ok": status == 200}
            if status != 200:
                after["body"] = data[:300].decode(errors="replace")
        except (OSError, http.client.HTTPException) as err:
            after = {"status": None, "ok": False, "error": f"{type(err).__name__}: {err}"}
        try:
            final = admission(parse_metrics(probe_once(port, probes[2])[2].decode()))
        except (OSError, http.client.HTTPException) as err:
            print(f"could not read /metrics at the end: {err!r}")
        time.sleep(1.0)
        stop_memory.set()
        sampler.join()
        settled = memory.sample()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    wall_seconds = time.monotonic() - wall_start

    large, large_bodies = summary(outcomes), summary(body_outcomes)
    peak = memory.peak(overload_offset)
    pids = sorted(memory.peak_by_pid, key=lambda p: p != proc.pid)
    result: dict[str, Any] = {
        "concurrency": concurrency,
        "workers": workers,
        "seconds": args.seconds,
        "memory_limit_bytes": limit,
        "budget_per_worker_bytes": budget,
        "large_request": {"body": LARGE, "computed_numbers": computed, "cost_bytes": cost},
        "bodies": n_bodies,
        "large_body": None
        if big is None
        else {
            "body_bytes": len(big.body),
            "shape": big.shape,
            "include": ["output"],
            "computed_numbers": big.computed,
            "cost_bytes": cost_bytes(big.computed),
            "client_parse_seconds": round(big.parse_seconds, 3),
        },
        "wall_seconds": round(wall_seconds, 1),
        "server_start_seconds": round(started_in, 1),
        "overload_seconds": round(overload_seconds, 1),
        "large": large,
        "large_bodies": large_bodies,
        "probes": {
            p.name: {
                **latency_ms(p.latencies),
                "failures": len(p.failures),
                "slowest": slowest(p, overload_start),
                **targets(p),
            }
            for p in probes
        },
        "probe_failures": {p.name: p.failures[:10] for p in probes if p.failures},
        "rss": {
            "baseline_bytes": baseline,
            "peak_bytes": peak,
            "settled_bytes": settled,
            "peak_minus_budget_total_bytes": peak - budget * workers,
            "peak_over_budget_total": round(peak / (budget * workers), 3),
            "peak_over_limit": round(peak / limit, 3),
            "peak_by_process_bytes": {
                ("parent" if p == proc.pid else f"child {p}"): memory.peak_by_pid[p] for p in pids
            },
            "samples": [(round(t, 2), b) for t, b in memory.samples],
        },
        "metrics_peaks": peaks,
        "metrics_end": final,
        "small_after": after,
        "client_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    served = large if concurrency else large_bodies  # the group that must have a 200
    passed = (
        large["failures"] == 0
        and large_bodies["failures"] == 0
        and served["ok_200"] > 0
        and bool(after.get("ok"))
    )
    result["passed"] = passed
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"wrote {args.out}")
    print("overload run:", "PASSED" if passed else "FAILED")
    return 0 if passed else 1


def print_table(r: dict[str, Any]) -> None:
    def fmt(v: float | int | None) -> str:
        return "-" if v is None else f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"

    rss = r["rss"]
    budget_total = r["budget_per_worker_bytes"] * r["workers"]
    body = r["large_body"]
    bodies = f", {r['bodies']} × {body['body_bytes'] / MiB:.1f} MiB bodies" if body else ""
    rows: list[tuple[str, str]] = [
        ("run", f"{r['concurrency']} large at once{bodies}, {r['workers']} workers, "
                f"{r['memory_limit_bytes'] / 2**30:g} GiB limit (simulated)"),
        ("time", f"{r['wall_seconds']} s in all, overload {r['overload_seconds']} s"),
    ]  # fmt: skip
    for group, name in (("large", "large"), ("large_bodies", "large bodies")):
        g = r[group]
        if not g["sent"]:
            continue
        others = {k: n for k, n in g["statuses"].items() if k not in ("200", "503")}
        rows += [
            (f"{name}: sent", fmt(g["sent"])),
            (f"{name}: 200", fmt(g["ok_200"])),
            (f"{name}: 503 + Retry-After", fmt(g["refused_503_with_retry_after"])),
            (f"{name}: anything else", f"{g['failures']} {others}"),
        ]
        for label, key in (
            ("200", "latency_200"),
            ("200 headers", "headers_200"),
            ("503", "latency_503"),
        ):
            lat = g[key]
            rows.append(
                (f"{name} {label} ms p50/max", f"{fmt(lat['p50_ms'])} / {fmt(lat['max_ms'])}")
            )
    for name, p in r["probes"].items():
        target = (
            f"; target {p['target']}: {'held' if p['target_held'] else 'MISSED'}"
            if "target" in p
            else ""
        )
        rows.append(
            (
                f"{name} ms p50/p99/max",
                f"{fmt(p['p50_ms'])} / {fmt(p['p99_ms'])} / {fmt(p['max_ms'])}"
                f"  (n={p['count']}, failed {p['failures']}){target}",
            )
        )
    peak, over = rss["peak_bytes"], rss["peak_minus_budget_total_bytes"]
    rows += [
        ("RSS baseline / peak / after", f"{mib(rss['baseline_bytes'])} / {mib(peak)} / "
                                        f"{mib(rss['settled_bytes'])}"),
        ("peak vs budget × workers", f"{mib(peak)} vs {mib(budget_total)}: "
                                     f"{rss['peak_over_budget_total']:.2f}×, "
                                     f"{mib(abs(over))} {'over' if over > 0 else 'under'}"),
        ("peak vs memory limit", f"{mib(peak)} vs {mib(r['memory_limit_bytes'])}: "
                                 f"{rss['peak_over_limit']:.2f}×"),
        ("peak per process", ", ".join(f"{k} {mib(v)}"
                                       for k, v in rss["peak_by_process_bytes"].items())),
        ("metrics peak in_use / waiting",
         f"{mib(r['metrics_peaks']['attention_budget_in_use_bytes'])} / "
         f"{r['metrics_peaks']['attention_waiting']:.0f}"),
    ]  # fmt: skip
    end = r["metrics_end"]
    for name in ("attention_admitted_total", "attention_queued_total"):
        rows.append((f"end {name}", fmt(int(end.get(name, 0)))))
    rejected = {k: v for k, v in end.items() if k.startswith("attention_rejected_total")}
    rows.append(
        (
            "end attention_rejected_total",
            ", ".join(
                f"{k.removeprefix('attention_rejected_total')} {v:,.0f}"
                for k, v in rejected.items()
            )
            or "0",
        )
    )
    after = r["small_after"]
    rows.append(("small request after", "ok" if after.get("ok") else f"FAILED {after}"))
    rows.append(("client max RSS", mib(r["client_max_rss_bytes"])))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    sys.exit(main())
