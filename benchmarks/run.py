"""`make bench`: issue 4's performance table, each row measured side by side in one run.

Starts a real server (`python -m service`, 1 worker) on a free loopback port, alternates the
two sides of every comparison, takes medians, prints the ratios and writes them to
benchmarks/results/latest.json. Absolute times on shared machines are noise; ratios are not.
Needs curl; P2, C1, C2, S1 and S1t need wrk (apt-get install wrk) and P6 needs torch — rows
whose tool is missing say so and are skipped.

C1/C2 (what the connection protections cost a small request): three pairs of fresh one-worker
servers, all launched through ``service.__main__.main`` (same app, settings, logging, access
log, proxy headers, server header), in each pair one with its ``GuardedProtocol`` and one with
uvicorn's stock httptools protocol; wrk runs alternate within each pair, and the value is the
median guarded ÷ stock ratio of back-to-back runs (its quartiles show how noisy the machine was);
the detail gives the servers' CPU per request too (/proc), which the machine's drift touches less.

S1/S1t (small requests against plain FastAPI apps): P2's 3-token POST /attention on the service
against two peers from benchmarks/peers.py, each plain uvicorn with 1 worker on the same loopback
and the same BLAS thread variables — S1 a lean one (raw body, orjson, NumPy inline, orjson out),
S1t a tutorial-style one (a pydantic body model, NumPy, FastAPI's default JSON). Both must give
the service's numbers for that body (checked to 1e-12 first); wrk -t2 -c8 runs rotate among the
three, medians of the rounds; the service ÷ each peer in requests/s.

B1/B1j/B2 (safetensors): /attention L=1024 d=64, every output, the body sent as safetensors
with ``Accept: application/x-safetensors`` (as the Python client does): B1 end to end (curl) ÷
the in-process floor (the NumPy computation plus ``safetensors.numpy.save`` of the same arrays),
B1j the same request as JSON both ways ÷ as safetensors, B2 a fresh server's peak RSS increase
while answering it ÷ the response's size. A service that answers JSON to that Accept header skips the three rows.
R1/R2 (replicas behind nginx, harness/replicas.py, deploy/nginx/nginx.conf.template; need nginx
and wrk): P2's 3-token POST /attention. R1: requests/s through nginx to 2 replicas ÷ through the
same nginx configuration to 1 replica (each replica ``python -m service --workers 1``; wrk -t2
-c16, the two sides alternating, medians). R2: p50 latency through nginx ÷ straight to the same
single replica (wrk -t1 -c1, alternating, medians). Everything (wrk, nginx, the replicas) shares
this machine's CPUs, which the detail says.

E1/E2/E3 (the explorer page, benchmarks/explorer.py; need Debian's Chromium and playwright): a
generated L-token sentence drawn by the page, Run to first paint ÷ the same answer fetched and
read by the page's own safetensors reader up to the next frame (alternating, medians), at
L = 2048 and 512; and the
JavaScript heap of the drawn L = 2048 page ÷ the weights' float64 bytes.

E4–E9 (the explorer's trained-model tab at paragraph length, benchmarks/model_page.py; need
Debian's Chromium, playwright and minilm): a 126-token paragraph at 1440 × 900, MB on the wire and
seconds from Run to drawn, page height in screens, the share of thumbnails visibly non-blank,
summary lines, compare present and answering; a row the page does not allow says "not measurable".

M1 (a trained model, benchmarks/models.py; needs torch, transformers and make models): POST
/model with all-MiniLM-L6-v2 on 128 tokens, every output, end to end ÷ the same forward in
transformers float64 in process.

Z1–Z4 (compressed JSON answers, benchmarks/compressed.py): bytes and time of each coding ÷ identity.

G1–G6 (the backward pass, benchmarks/backward.py): forward + backward against torch autograd in
process, and requests with grad_output against the same without and against torch.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

THREADS = str(os.cpu_count() or 1)
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, THREADS)  # the engine and torch get the same thread count (P6)

import numpy as np  # noqa: E402
import orjson  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import backward  # noqa: E402  (benchmarks/backward.py: G1–G6)
import compressed  # noqa: E402  (benchmarks/compressed.py: Z1–Z4)
import explorer  # noqa: E402  (benchmarks/explorer.py, beside this script)
import model_page  # noqa: E402  (benchmarks/model_page.py: E4–E9)

from harness.live import free_port, http_json, start_server  # noqa: E402
from models import m1  # noqa: E402  (benchmarks/models.py)
from service.core.attention import project, scaled_dot_product_attention  # noqa: E402
from service.core.multihead import MultiheadWeights, multihead_attention  # noqa: E402
from service.trace.outputs import sizes  # noqa: E402
from service.trace.rules import attention_shapes  # noqa: E402
from service.wire.schemas.requests import AttentionRequest  # noqa: E402

Row = dict[str, Any]


def attention_body(L: int, d_model: int = 64, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(L, d_model))
    w = {n: rng.normal(size=(d_model, 64)) / 8 for n in ("w_q", "w_k", "w_v")}
    return {"x": x.tolist(), **{n: a.tolist() for n, a in w.items()}}


def multihead_body(L: int = 512, d_model: int = 256, h: int = 8) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    body = {"x": rng.normal(size=(L, d_model)).tolist(), "num_heads": h}
    for n in ("w_q", "w_k", "w_v", "w_o"):
        body[n] = (rng.normal(size=(d_model, d_model)) / 16).tolist()
    return body


def attention_arrays(body: dict[str, Any]) -> dict[str, Any]:
    """Every array of the default /attention response (in_out weights), computed in process."""
    x = np.asarray(body["x"])[None]
    q, k, v = (project(x, np.asarray(body[n])) for n in ("w_q", "w_k", "w_v"))
    t = scaled_dot_product_attention(q, k, v)
    return {"q": t.q[0], "k": t.k[0], "v": t.v[0], "scores": t.scores[0],
            "scaled_scores": t.scaled_scores[0], "weights": t.weights[0], "output": t.output[0]}  # fmt: skip


def attention_floor(body: dict[str, Any]) -> bytes:
    """The floor: the same NumPy computation plus orjson of the same arrays, in process."""
    return orjson.dumps(attention_arrays(body), option=orjson.OPT_SERIALIZE_NUMPY)


def safetensors_floor(body: dict[str, Any]) -> bytes:
    """B1's floor: the same NumPy computation plus safetensors.numpy.save of the same arrays."""
    from safetensors.numpy import save

    return save(attention_arrays(body))


def multihead_floor(body: dict[str, Any]) -> bytes:
    x = np.asarray(body["x"])[None]
    w_q, w_k, w_v, w_o = (np.asarray(body[n]) for n in ("w_q", "w_k", "w_v", "w_o"))
    w = MultiheadWeights(w_q, w_k, w_v, w_o=w_o)
    t = multihead_attention(x, w, num_heads=body["num_heads"])
    hs = t.heads
    heads = [{n: np.ascontiguousarray(getattr(hs, n)[0, i]) for n in
              ("q", "k", "v", "scores", "scaled_scores", "weights", "output")} for i in range(body["num_heads"])]  # fmt: skip
    return orjson.dumps(
        {"heads": heads, "average_weights": t.average_weights[0], "weights": hs.weights[0],
         "concat": t.concat[0],
         "projected": t.projected[0], "output": t.output[0]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )  # fmt: skip


def curl_seconds(url: str, body_file: str) -> float:
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}", "-H",
         "Content-Type: application/json", "--data-binary", f"@{body_file}", url],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert out[0] == "200", f"{url} answered {out[0]}"
    return float(out[1])


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(a: Callable[[], float], b: Callable[[], float], runs: int) -> tuple[float, float]:
    """Median of each side, the two sides interleaved so drift hits both alike."""
    xs, ys = [], []
    for _ in range(runs):
        xs.append(a())
        ys.append(b())
    return statistics.median(xs), statistics.median(ys)


def write_body(body: dict[str, Any], tmp: Path, name: str) -> str:
    path = tmp / name
    path.write_bytes(orjson.dumps(body))
    return str(path)


def write_binary_body(body: dict[str, Any], tmp: Path, name: str) -> str:
    """``body`` (all arrays) as a safetensors request, as the Python client sends it."""
    from safetensors.numpy import save

    path = tmp / name
    path.write_bytes(save({k: np.asarray(v, dtype=np.float64) for k, v in body.items()}))
    return str(path)


def p1_p3(base: str, tmp: Path, runs: int) -> list[Row]:
    rows = []
    for rid, path, body, floor, target, what in (
        ("P1", "/attention", attention_body(1024), attention_floor, 1.2, "POST /attention L=1024 d=64, full trace, curl"),
        ("P3", "/multihead", multihead_body(), multihead_floor, 1.2, "POST /multihead L=512 d=256 h=8, full trace"),
    ):  # fmt: skip
        f = write_body(body, tmp, rid + ".json")

        def in_process(body: dict[str, Any] = body, floor: Callable[..., bytes] = floor) -> float:
            return timed(lambda: floor(body))

        def over_http(f: str = f, path: str = path) -> float:
            return curl_seconds(base + path, f)

        floor_s, service_s = alternate(in_process, over_http, runs)
        rows.append(row(rid, what, service_s / floor_s, "≤", target,
                        f"service {service_s * 1e3:.0f} ms, floor {floor_s * 1e3:.0f} ms (medians of {runs})"))  # fmt: skip
    return rows


def d1_d2(base: str, tmp: Path, runs: int) -> list[Row]:
    """What comparing costs: /mask L=512 d=64 with a causal mask and include ["weights"], with
    expected weights beside the same request without. D1: the course notebook's two mistakes
    (found among the pairs); D2: noise, which no set explains (every trial runs)."""
    L = 512
    body = attention_body(L) | {"mask": {"type": "causal"}, "include": ["weights"]}
    x, w_q, w_k = (np.array(body[n]) for n in ("x", "w_q", "w_k"))
    scores = np.where(np.tril(np.ones((L, L))) > 0, (x @ w_q) @ (x @ w_k).T, -np.inf)
    columns = np.exp(scores - scores.max(axis=0))  # the notebook: softmax down the columns
    notebook = columns / columns.sum(axis=0) / 8.0  # ÷ √d_k after it
    plain_f = write_body(body, tmp, "D-plain.json")
    rng = np.random.default_rng(5)
    rows = []
    for rid, what, expected in (
        ("D1", "comparison with a diagnosis (2 mistakes), L=512", notebook),
        ("D2", "comparison, no mistake explains it (all trials), L=512",
         np.clip(notebook + rng.normal(size=(L, L)) * 1e-3, 0, None)),
    ):  # fmt: skip
        f = write_body(body | {"expected": {"weights": expected.tolist()}}, tmp, rid + ".json")

        def plain() -> float:
            return curl_seconds(base + "/mask", plain_f)

        def compared(f: str = f) -> float:
            return curl_seconds(base + "/mask", f)

        plain_s, compare_s = alternate(plain, compared, runs)
        rows.append(row(rid, what + " ÷ the same request without expected", compare_s / plain_s,
                        "≤", 20, f"{compare_s * 1e3:.0f} vs {plain_s * 1e3:.0f} ms (medians of {runs})"))  # fmt: skip
    return rows


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and every process below it (Linux /proc), in seconds."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            total += sum(int(f) for f in stat.rsplit(")", 1)[1].split()[11:13])  # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return total / os.sysconf("SC_CLK_TCK")


PLAIN_REPS = 8  # D3: the request without expected is measured this many times as often


def d3(base: str, pid: int, tmp: Path, runs: int, reps: int = 3) -> Row:
    """The diagnosis's worst case (issue finding H2): /multihead where every mistake applies
    (two heads, RoPE, a causal mask, residual, layer norm, square w_o; L=512, d_model=4, an
    84 kB body), the expected output the service's plus noise that no set of mistakes explains,
    and include ["output"] on both sides, so that the request without expected is as cheap as
    it gets. CPU seconds of the server and its parser processes (wall time on a shared machine
    would measure the neighbours; each sample is ``reps`` requests in a row, as /proc counts
    CPU in 10 ms ticks), with expected ÷ without."""
    rng = np.random.default_rng(9)
    L, d = 512, 4
    body: dict[str, Any] = {
        "x": rng.normal(size=(L, d)).tolist(), "num_heads": 2, "rope": {},
        "mask": {"type": "causal"}, "residual": True, "layer_norm": True, "include": ["output"],
        **{n: (rng.normal(size=(d, d)) / 2).tolist() for n in ("w_q", "w_k", "w_v", "w_o")},
    }  # fmt: skip
    status, answer = http_json(base + "/multihead", body)
    assert status == 200, answer
    noisy = np.asarray(answer["output"]) + rng.normal(size=(L, d)) * 1e-3
    plain_f = write_body(body, tmp, "D3-plain.json")
    compared_f = write_body(body | {"expected": {"output": noisy.tolist()}}, tmp, "D3.json")
    size = Path(compared_f).stat().st_size

    def cpu(f: str, n: int) -> Callable[[], float]:
        def run() -> float:
            before = tree_cpu_seconds(pid)
            for _ in range(n):
                curl_seconds(base + "/multihead", f)
            return (tree_cpu_seconds(pid) - before) / n

        return run

    # the plain request costs about one 10 ms tick: PLAIN_REPS × as many of it in each sample,
    # so that the tick's rounding does not swing the ratio by a third
    plain_s, compare_s = alternate(cpu(plain_f, PLAIN_REPS * reps), cpu(compared_f, reps), runs)
    return row("D3", "comparison, the diagnosis's worst case (/multihead, every mistake applies, "
               "noise in expected.output, L=512, include output): server CPU ÷ the same request "
               "without expected", compare_s / plain_s, "≤", 20,
               f"{compare_s * 1e3:.0f} vs {plain_s * 1e3:.1f} ms of CPU per request (medians of "
               f"{runs} samples of {reps}, of {PLAIN_REPS * reps} without expected), a "
               f"{size / 1e3:.0f} kB body")  # fmt: skip


def wrk_rps(url: str, seconds: int, script: str | None = None) -> float:
    cmd = ["wrk", "-t2", "-c8", f"-d{seconds}s", url] + (["-s", script] if script else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    return float(
        next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec"))
    )


def p2(base: str, tmp: Path, rounds: int) -> Row:
    if not shutil.which("wrk"):
        return skipped(
            "P2",
            "POST /attention 3 tokens vs GET /healthz, wrk -c8",
            "wrk is not installed (apt-get install wrk)",
        )
    script = post_script(tmp)
    health, attention = alternate(lambda: wrk_rps(base + "/healthz", 4),
                                  lambda: wrk_rps(base + "/attention", 4, script), rounds)  # fmt: skip
    return row("P2", "POST /attention 3 tokens vs GET /healthz, wrk -c8", attention / health, "≥", 0.8,
               f"{attention:.0f} vs {health:.0f} requests/s (medians of {rounds})")  # fmt: skip


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def p4(tmp: Path) -> Row:
    """On a fresh server (a warm one keeps freed memory in its allocator and would show less)."""
    proc, base = start_server(workers=1)
    try:
        from service.wire.examples import I_AM_BATMAN

        small = write_body(I_AM_BATMAN, tmp, "P4-small.json")
        curl_seconds(base + "/attention", small)  # imports and first-call costs are not P1's
        f = write_body(attention_body(1024), tmp, "P4.json")
        baseline = rss_kb(proc.pid, "VmRSS")
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # reset the peak (VmHWM) to now
        subprocess.run(["curl", "-s", "-H", "Content-Type: application/json", "--data-binary", f"@{f}",
                        base + "/attention", "-o", str(tmp / "P4.out")], check=True)  # fmt: skip
        peak = rss_kb(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    size = (tmp / "P4.out").stat().st_size
    increase = (peak - baseline) * 1024
    return row("P4", "peak RSS increase during one P1 request / response size", increase / size, "≤", 1.5,
               f"+{increase / 1e6:.0f} MB for a {size / 1e6:.0f} MB response")  # fmt: skip


def p5(base: str, tmp: Path, runs: int) -> Row:
    """Each L once untimed (its first request also pays for first calls and the allocator's
    growth), then ``runs`` rounds over every L, medians."""
    lengths = (128, 256, 512, 1024, 2048)
    numbers, files = {}, {}
    for L in lengths:
        body = attention_body(L)
        numbers[L] = sum(sizes(attention_shapes(AttentionRequest.model_validate(body))).values())
        files[L] = write_body(body, tmp, f"P5-{L}.json")
        curl_seconds(base + "/attention", files[L])
    seconds: dict[int, list[float]] = {L: [] for L in lengths}
    for i in range(runs):
        for L in lengths[::-1] if i % 2 else lengths:
            seconds[L].append(curl_seconds(base + "/attention", files[L]))
    per_million = {L: statistics.median(s) * 1e3 / (numbers[L] / 1e6) for L, s in seconds.items()}
    values = list(per_million.values())
    detail = ", ".join(f"L={L}: {v:.0f}" for L, v in per_million.items())
    return row("P5", "ms per million returned numbers, L=128…2048 (max/min)", max(values) / min(values), "≤", 1.5,
               f"{detail} ms/M (medians of {runs} rounds over the five, each L once untimed first)")  # fmt: skip


def p6(runs: int) -> Row:
    what = "engine vs torch SDPA, L=2048 d=64 float64, same threads"
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return skipped("P6", what, "torch is not installed (pip install torch==2.13.0)")
    torch.set_num_threads(int(THREADS))
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(1, 2048, 64)) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    ours, theirs = alternate(lambda: timed(lambda: scaled_dot_product_attention(q, k, v)),
                             lambda: timed(lambda: F.scaled_dot_product_attention(tq, tk, tv)), runs)  # fmt: skip
    return row("P6", what, ours / theirs, "≤", 1.2,
               f"{ours * 1e3:.1f} vs {theirs * 1e3:.1f} ms, {THREADS} threads (medians of {runs})")  # fmt: skip


def p7(base: str, tmp: Path, seconds: float) -> Row:
    f = write_body(attention_body(1024), tmp, "P7.json")
    data = Path(f).read_bytes()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            req = urllib.request.Request(
                base + "/attention", data=data, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        with urllib.request.urlopen(base + "/healthz", timeout=30) as r:
            r.read()
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.02)
    stop.set()
    for w in workers:
        w.join()
    p99 = float(np.percentile(latencies, 99)) * 1e3
    return row("P7", "GET /healthz p99 (ms) while 4 P1 requests run", p99, "<", 50,
               f"{len(latencies)} probes, p50 {np.percentile(latencies, 50) * 1e3:.1f} ms")  # fmt: skip


# `python -m service` exactly, except that with "stock" uvicorn gets its own httptools protocol
LAUNCHER = """
import sys
import uvicorn
stock = sys.argv.pop(1) == "stock"
run = uvicorn.run
def launch(*args, **kwargs):
    assert kwargs["http"] == "service.http.connection:GuardedProtocol", kwargs["http"]
    run(*args, **{**kwargs, "http": "httptools" if stock else kwargs["http"]})
uvicorn.run = launch
from service.__main__ import main
main(sys.argv[1:])
"""
PROTECTION_TARGET = 0.95  # guarded ÷ stock requests/s: the protections cost at most 5 %


def start_launched(sides: list[bool]) -> list[tuple[subprocess.Popen[bytes], str]]:
    """One worker per side (True: stock protocol) via LAUNCHER, each on a free loopback port,
    started together; returns once every /healthz answers."""
    started = []
    for stock in sides:
        port = free_port()
        args = ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        out = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server)
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, "stock" if stock else "guarded", *args],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        started.append((proc, f"http://127.0.0.1:{port}", out))
    deadline = time.monotonic() + 60
    for proc, base, out in started:
        while True:
            try:
                if http_json(base + "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                for other, _, _ in started:
                    other.kill()
                out.seek(0)
                log = out.read().decode(errors="replace")
                raise RuntimeError(f"a server for C1/C2 did not start:\n{log}")
            time.sleep(0.2)
    return [(proc, base) for proc, base, _ in started]


def raw_status(base: str, request: bytes) -> int:
    """The status code a raw HTTP request gets."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        return int(s.recv(64).split()[1])


def wrk_stats(url: str, seconds: int, script: str | None = None) -> tuple[float, float]:
    """(requests/s, p99 latency in ms) from one wrk -t2 -c8 run."""
    cmd = ["wrk", "-t2", "-c8", "--latency", f"-d{seconds}s", url] + (
        ["-s", script] if script else []
    )
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rps = float(
        next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec"))
    )
    p99 = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("99%"))
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    number = p99.rstrip("usm")
    return rps, float(number) * unit[p99[len(number) :]]


def post_script(tmp: Path) -> str:
    """A wrk script that POSTs P2's 3-token /attention request."""
    from service.wire.examples import I_AM_BATMAN

    script = tmp / "post.lua"
    body = json.dumps(I_AM_BATMAN).replace("\\", "\\\\").replace('"', '\\"')
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = "{body}"\nwrk.headers["Content-Type"] = "application/json"\n'
    )
    return str(script)


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile."""
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def c1_c2(tmp: Path, ids: set[str], pairs: int = 3, rounds: int = 3, seconds: int = 1) -> list[Row]:
    """Guarded vs stock protocol on small requests: ``pairs`` pairs of one-worker servers
    (several, since one process can run several % faster or slower than an identical one), a
    wrk run on each side of a pair back to back, the side going first swapped each time; the
    value is the median of those pairs' guarded ÷ stock ratios."""
    what = {"C1": "connection protections: POST /attention 3 tokens, guarded ÷ stock protocol",
            "C2": "connection protections: GET /healthz, guarded ÷ stock protocol"}  # fmt: skip
    if not shutil.which("wrk"):
        return [skipped(rid, w, "wrk is not installed (apt-get install wrk)")
                for rid, w in what.items() if rid in ids]  # fmt: skip
    from service.wire.examples import I_AM_BATMAN

    script = post_script(tmp)
    sides = [
        stock for k in range(pairs) for stock in ((False, True) if k % 2 == 0 else (True, False))
    ]
    servers = start_launched(sides)  # which side starts first alternates too
    try:
        # the two sides really differ: only the guarded protocol refuses a second Host header
        twice = b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"
        codes = [raw_status(base, twice) for _, base in servers]
        expected = [200 if stock else 400 for stock in sides]
        assert codes == expected, (
            f"stock/guarded servers {sides} answered a doubled Host with {codes}"
        )
        bases = [(servers[2 * k + sides[2 * k]][1], servers[2 * k + 1 - sides[2 * k]][1])
                 for k in range(pairs)]  # (guarded, stock) per pair  # fmt: skip
        pids = {base: proc.pid for proc, base in servers}
        rows = []
        for rid, path, lua in (("C1", "/attention", script), ("C2", "/healthz", None)):
            if rid not in ids:
                continue
            for _, base in servers:  # first calls (imports, caches) are not what is measured
                for _ in range(20):
                    http_json(base + path, I_AM_BATMAN if lua else None)

            def run(base: str) -> tuple[float, float, float]:
                """(requests/s, p99 ms, the server's CPU µs per request) of one wrk run."""
                before = tree_cpu_seconds(pids[base])
                rps, p99 = wrk_stats(base + path, seconds, lua)  # noqa: B023 (called at once)
                return rps, p99, (tree_cpu_seconds(pids[base]) - before) / (rps * seconds) * 1e6

            # (guarded, stock) (requests/s, p99 ms, CPU µs), each pair of runs back to back
            runs: list[tuple[tuple[float, float, float], tuple[float, float, float]]] = []
            for i in range(rounds):
                for k, (guarded, stock) in enumerate(bases):
                    if (i + k) % 2 == 0:
                        g = run(guarded)
                        runs.append((g, run(stock)))
                    else:
                        s = run(stock)
                        runs.append((run(guarded), s))
            # the median of the ratios of back-to-back runs: load from elsewhere on the machine
            # that comes and goes hits both runs of a pair alike
            q1, ratio, q3 = quartiles([g[0] / s[0] for g, s in runs])
            p99_ratio = statistics.median(g[1] / s[1] for g, s in runs)
            cpu_ratio = statistics.median(g[2] / s[2] for g, s in runs)
            g_rps, s_rps, g_p99, s_p99, g_cpu, s_cpu = (
                statistics.median(r[side][f] for r in runs) for f in (0, 1, 2) for side in (0, 1)
            )
            verdict = "PASS" if ratio >= PROTECTION_TARGET else "WARN"
            r = row(rid, what[rid], ratio, "≥", PROTECTION_TARGET,
                    f"{verdict}: {g_rps:.0f} vs {s_rps:.0f} requests/s, p99 {g_p99:.2f} vs {s_p99:.2f} ms "
                    f"(p99 ratio {p99_ratio:.2f}), server CPU per request {g_cpu:.0f} vs "
                    f"{s_cpu:.0f} µs (ratio {cpu_ratio:.2f}: less touched by the machine's "
                    f"drift); median of {len(runs)} back-to-back pairs of "
                    f"{seconds} s wrk -t2 -c8 runs on {pairs} server pairs (1 worker each), "
                    f"ratios' quartiles {q1:.2f}–{q3:.2f}")  # fmt: skip
            r["p99_ratio"] = round(p99_ratio, 3)
            r["cpu_ratio"] = round(cpu_ratio, 3)
            r["runs"] = [[round(g[0]), round(s[0])] for g, s in runs]  # requests/s per pair
            rows.append(r)
        return rows
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            proc.wait(timeout=30)


S1_WHAT = {
    "S1": "POST /attention 3 tokens, requests/s: service ÷ lean peer (orjson in and out)",
    "S1t": "POST /attention 3 tokens, requests/s: service ÷ tutorial peer (pydantic, FastAPI JSON)",
}
S1_TARGETS = {"S1": 1.0, "S1t": 1.5}
TRACE = ("q", "k", "v", "scores", "scaled_scores", "weights", "output")


def start_peer(app: str) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m uvicorn benchmarks.peers:<app>`` from the repository root, one worker, on a
    free loopback port, uvicorn's defaults otherwise (httptools, uvloop when installed, access
    log on), the BLAS thread variables of this process (as the service gets them); returns once
    it answers P2's 3-token request."""
    from service.wire.examples import I_AM_BATMAN

    port = free_port()
    out = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", f"benchmarks.peers:{app}", "--host",
                             "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if http_json(base + "/attention", I_AM_BATMAN)[0] == 200:
                return proc, base
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out.seek(0)
            raise RuntimeError(f"peer {app} did not start:\n{out.read().decode(errors='replace')}")
        time.sleep(0.2)


def same_numbers(
    mine: dict[str, Any], theirs: dict[str, Any], who: str, tol: float = 1e-12
) -> None:
    """Every trace array of ``theirs`` equals the service's (``mine``) to ``tol``."""
    for name in TRACE:
        a, b = np.asarray(mine[name], dtype=float), np.asarray(theirs[name], dtype=float)
        assert a.shape == b.shape, f"{who}: {name} is {b.shape}, the service's {a.shape}"
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        assert diff <= tol, f"{who}: {name} differs from the service's by {diff:.3g}"


def s1(base: str, tmp: Path, ids: set[str], rounds: int = 5, seconds: int = 3) -> list[Row]:
    """Small requests/s, our service (``base``: python -m service, 1 worker) against the two
    peers of benchmarks/peers.py (plain uvicorn, 1 worker), each answering P2's 3-token body with
    the same numbers (checked first); per round one wrk -t2 -c8 run on each of the three, the
    order rotating; medians of the rounds."""
    wanted = [rid for rid in S1_WHAT if rid in ids]
    if not shutil.which("wrk"):
        return [skipped(rid, S1_WHAT[rid], "wrk is not installed (apt-get install wrk)", f"≥ {S1_TARGETS[rid]}")
                for rid in wanted]  # fmt: skip
    from service.wire.examples import I_AM_BATMAN

    script = post_script(tmp)
    peers = [start_peer("lean"), start_peer("tutorial")]
    try:
        sides = {"service": base, "lean": peers[0][1], "tutorial": peers[1][1]}
        status, ours = http_json(base + "/attention", I_AM_BATMAN)
        assert status == 200, f"the service answered {status}"
        for name in ("lean", "tutorial"):
            same_numbers(ours, http_json(sides[name] + "/attention", I_AM_BATMAN)[1], name)
        for url in sides.values():  # first calls (imports, caches) are not what is measured
            for _ in range(20):
                http_json(url + "/attention", I_AM_BATMAN)
        names = list(sides)
        rps: dict[str, list[float]] = {n: [] for n in names}
        p99: dict[str, list[float]] = {n: [] for n in names}
        for i in range(rounds):
            for n in names[i % 3 :] + names[: i % 3]:
                requests, latency = wrk_stats(sides[n] + "/attention", seconds, script)
                rps[n].append(requests)
                p99[n].append(latency)
    finally:
        for proc, _ in peers:
            proc.terminate()
        for proc, _ in peers:
            proc.wait(timeout=30)
    med = {n: statistics.median(v) for n, v in rps.items()}
    lat = {n: statistics.median(v) for n, v in p99.items()}
    rows = []
    for rid, peer in (("S1", "lean"), ("S1t", "tutorial")):
        if rid not in ids:
            continue
        per_round = [s / p for s, p in zip(rps["service"], rps[peer], strict=True)]
        detail = (
            f"{med['service']:.0f} vs {med[peer]:.0f} requests/s, p99 {lat['service']:.2f} vs "
            f"{lat[peer]:.2f} ms (medians of {rounds} rounds of {seconds} s wrk -t2 -c8 on each "
            f"side, order rotating; per-round ratios {min(per_round):.2f}–{max(per_round):.2f}); "
            "same numbers checked to 1e-12; the service logs one JSON access line per request, "
            f"the {peer} peer uvicorn's default access line (both to a file); "
            f"{'async, orjson in and out' if peer == 'lean' else 'sync def (threadpool), pydantic body, FastAPI default JSONResponse'}; "
            f"BLAS threads {os.environ['OPENBLAS_NUM_THREADS']} on every side"
        )
        r = row(rid, S1_WHAT[rid], med["service"] / med[peer], "≥", S1_TARGETS[rid], detail)
        r["runs"] = [[round(s), round(p)] for s, p in zip(rps["service"], rps[peer], strict=True)]
        rows.append(r)
    return rows


SAFETENSORS = "application/x-safetensors"
B_WHAT = {
    "B1": "POST /attention L=1024 d=64, full trace, safetensors both ways, curl ÷ in-process floor",
    "B1j": "the same request as JSON both ways ÷ as safetensors, end to end (curl)",
    "B2": "peak RSS increase during one B1 request (safetensors) / response size",
}
B_TARGETS = {"B1": "≤ 1.0", "B1j": "≥ 2", "B2": "≤ 1.2"}  # as passed to row() below
NOT_YET = "the service does not answer safetensors yet (Accept: application/x-safetensors got {})"


def curl_fetch(url: str, body_file: str, accept: str, out: str) -> tuple[float, str, int]:
    """POST a body (safetensors when the file ends in .safetensors, else JSON) with ``Accept``,
    the answer to ``out``: (seconds, content type, bytes)."""
    sent = SAFETENSORS if body_file.endswith(".safetensors") else "application/json"
    res = subprocess.run(
        ["curl", "-s", "-o", out, "-w", "%{http_code} %{time_total} %{size_download} %{content_type}",
         "-H", f"Content-Type: {sent}", "-H", f"Accept: {accept}",
         "--data-binary", f"@{body_file}", url],
        capture_output=True, text=True, check=True,
    ).stdout.split(" ", 3)  # fmt: skip
    code, seconds, size = res[:3]
    assert code == "200", f"{url} answered {code}"
    ctype = res[3].split(";")[0].strip() if len(res) > 3 else ""
    return float(seconds), ctype, int(size)


def safetensors_matches(path: Path, body: dict[str, Any]) -> list[str]:
    """The response's arrays equal the floor's to 1e-12; returns the names it holds."""
    from safetensors.numpy import load

    got = load(path.read_bytes())
    want = attention_arrays(body)
    missing = set(want) - set(got)
    assert not missing, f"the safetensors response lacks {sorted(missing)}"
    for name in want:
        a, b = want[name], got[name]
        assert a.size == b.size, f"safetensors {name} is {b.shape}, the floor's {a.shape}"
        diff = float(np.max(np.abs(a.reshape(b.shape) - b)))
        assert diff <= 1e-12, f"safetensors {name} differs from the floor's by {diff:.3g}"
    return sorted(got)


def b1(base: str, tmp: Path, ids: set[str], runs: int) -> list[Row]:
    """/attention L=1024 d_model=64 (every output) as safetensors both ways end to end (curl,
    body from a file, answer to /dev/null; the first to a file, checked against the floor's
    arrays), against
    the floor (the same NumPy plus safetensors.numpy.save, in process, from the parsed body) and
    the same request as JSON both ways; the three sides interleaved, medians."""
    body = attention_body(1024)
    f = write_body(body, tmp, "B1.json")
    fb = write_binary_body(body, tmp, "B1.safetensors")
    st_out = str(tmp / "B1-answer.safetensors")
    _, ctype, st_size = curl_fetch(base + "/attention", fb, SAFETENSORS, st_out)  # first call
    if ctype != SAFETENSORS:
        return [skipped(rid, B_WHAT[rid], NOT_YET.format(ctype or "no content type"), B_TARGETS[rid])
                for rid in ("B1", "B1j") if rid in ids]  # fmt: skip
    names = safetensors_matches(Path(st_out), body)
    header = int.from_bytes(Path(st_out).read_bytes()[:8], "little")  # its JSON header's bytes
    json_size = curl_fetch(base + "/attention", f, "application/json", os.devnull)[2]
    floor_s: list[float] = []
    st_s: list[float] = []
    json_s: list[float] = []
    for i in range(runs):
        sides: list[Callable[[], None]] = [
            lambda: floor_s.append(timed(lambda: safetensors_floor(body))),
            lambda: st_s.append(curl_fetch(base + "/attention", fb, SAFETENSORS, os.devnull)[0]),
            lambda: json_s.append(curl_fetch(base + "/attention", f, "application/json", os.devnull)[0]),
        ]  # fmt: skip
        for side in sides[i % 3 :] + sides[: i % 3]:
            side()
    floor, st, js = (statistics.median(x) for x in (floor_s, st_s, json_s))
    spread = {  # the ratios within each round: how much the machine moved under the medians
        rid: "–".join(f"{q:.2f}" for q in quartiles(ratios)[::2]) if runs > 1 else "—"
        for rid, ratios in (
            ("B1", [a / b for a, b in zip(st_s, floor_s, strict=True)]),
            ("B1j", [a / b for a, b in zip(json_s, st_s, strict=True)]),
        )
    }
    rows = []
    if "B1" in ids:
        rows.append(row("B1", B_WHAT["B1"], st / floor, "≤", 1.0,
                        f"{st * 1e3:.0f} ms for {st_size / 1e6:.1f} MB, floor {floor * 1e3:.0f} ms "
                        f"(medians of {runs}, the three sides interleaved, per-round ratios' quartiles "
                        f"{spread['B1']}); arrays {', '.join(names)} "
                        f"checked against the floor to 1e-12; the answer's {header / 1e3:.0f} kB header (its "
                        "JSON: summary, steps, conventions) is not in the floor, nor is parsing the body"))  # fmt: skip
    if "B1j" in ids:
        rows.append(row("B1j", B_WHAT["B1j"], js / st, "≥", 2,
                        f"JSON {js * 1e3:.0f} ms for {json_size / 1e6:.1f} MB vs safetensors "
                        f"{st * 1e3:.0f} ms for {st_size / 1e6:.1f} MB (medians of {runs}, per-round "
                        f"ratios' quartiles {spread['B1j']})"))  # fmt: skip
    return rows


def b2(tmp: Path) -> Row:
    """As P4, for B1's safetensors request: on a fresh server, after small JSON and safetensors
    requests (imports, first calls, the thread pool), reset the peak (VmHWM) to the current RSS,
    send B1's request, read the peak."""
    from service.wire.examples import I_AM_BATMAN

    proc, base = start_server(workers=1)
    try:
        small = write_body(I_AM_BATMAN, tmp, "B2-small.json")
        curl_fetch(base + "/attention", small, "application/json", str(tmp / "B2-small.out"))
        _, ctype, _ = curl_fetch(base + "/attention", small, SAFETENSORS, str(tmp / "B2-small.out"))
        for L in (4, 300):  # a small binary body, and one read off the event loop (threads)
            warm = write_binary_body(attention_body(L), tmp, f"B2-warm{L}.safetensors")
            curl_fetch(base + "/attention", warm, SAFETENSORS, str(tmp / "B2-small.out"))
        if ctype != SAFETENSORS:
            why = NOT_YET.format(ctype or "no content type")
            return skipped("B2", B_WHAT["B2"], why, B_TARGETS["B2"])
        f = write_binary_body(attention_body(1024), tmp, "B2.safetensors")
        baseline = rss_kb(proc.pid, "VmRSS")
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # reset the peak (VmHWM) to now
        _, ctype, size = curl_fetch(base + "/attention", f, SAFETENSORS, str(tmp / "B2.out"))
        peak = rss_kb(proc.pid, "VmHWM")
        after = rss_kb(proc.pid, "VmRSS")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert ctype == SAFETENSORS, ctype
    increase = (peak - baseline) * 1024
    return row("B2", B_WHAT["B2"], increase / size, "≤", 1.2,
               f"+{increase / 1e6:.1f} MB peak for a {size / 1e6:.1f} MB response (RSS "
               f"{(after - baseline) * 1024 / 1e6:+.1f} MB after): VmHWM after the request − "
               "VmRSS before it of the one server process (1 worker, no child), so the body, "
               "parsed inputs, intermediates, the encoded answer and whatever the allocator "
               "keeps; ÷ the response's bytes as curl downloaded them")  # fmt: skip


R_WHAT = {
    "R1": "POST /attention 3 tokens, requests/s through nginx: 2 replicas ÷ 1 replica",
    "R2": "POST /attention 3 tokens, p50 latency: through nginx ÷ straight to the replica",
}
R_TARGETS = {"R1": 1.7, "R2": 1.15}


def wrk_latency(
    url: str, seconds: int, script: str, threads: int, connections: int
) -> tuple[float, float]:
    """(requests/s, p50 latency in ms) from one wrk run; errors raise."""
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        "--latency",
        f"-d{seconds}s",
        "-s",
        script,
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rps = float(
        next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec"))
    )
    p50 = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("50%"))
    number = p50.rstrip("usm")
    return rps, float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[p50[len(number) :]]


def r1_r2(tmp: Path, ids: set[str], rounds: int = 5, seconds: int = 3) -> list[Row]:
    """R1: nginx in front of 2 replicas and (the same template) nginx in front of 1, wrk -t2
    -c16 on each in turn, the side going first swapped each round; R2: on the 1-replica setup,
    wrk -t1 -c1 through nginx and straight to its replica in turn. Medians of the rounds."""
    from harness.replicas import Replicas, nginx_binary
    from service.wire.examples import I_AM_BATMAN

    wanted = [rid for rid in ("R1", "R2") if rid in ids]
    missing = [tool for tool, found in (("nginx", nginx_binary()), ("wrk", shutil.which("wrk"))) if not found]  # fmt: skip
    if missing:
        why = " and ".join(missing) + " not installed (apt-get install nginx wrk)"
        return [skipped(rid, R_WHAT[rid], why, f"{'≥' if rid == 'R1' else '≤'} {R_TARGETS[rid]}") for rid in wanted]  # fmt: skip
    script = post_script(tmp)
    two, one = Replicas(2).start_all(), None
    try:
        one = Replicas(1).start_all()
        direct = one.replicas[0].base
        for url in (two.url, one.url, direct):  # first calls (imports, caches) are not measured
            for _ in range(20):
                assert http_json(url + "/attention", I_AM_BATMAN)[0] == 200, url
        rows = []
        if "R1" in ids:
            rps2: list[float] = []
            rps1: list[float] = []
            for i in range(rounds):
                sides = [(two.url, rps2), (one.url, rps1)]
                for url, out in sides if i % 2 == 0 else sides[::-1]:
                    out.append(wrk_latency(url + "/attention", seconds, script, 2, 16)[0])
            served = [two.served(0), two.served(1)]
            m2, m1 = statistics.median(rps2), statistics.median(rps1)
            per_round = [a / b for a, b in zip(rps2, rps1, strict=True)]
            r = row("R1", R_WHAT["R1"], m2 / m1, "≥", R_TARGETS["R1"],
                    f"{m2:.0f} vs {m1:.0f} requests/s (medians of {rounds} rounds of {seconds} s "
                    f"wrk -t2 -c16 on each side, alternating; per-round ratios {min(per_round):.2f}–"
                    f"{max(per_round):.2f}); the 2 replicas served {served[0]} and {served[1]} "
                    f"(their /metrics); on {os.cpu_count()} CPUs shared by wrk (2 threads), nginx "
                    "(worker_processes auto) and the replicas (1 worker each), nothing pinned")  # fmt: skip
            r["runs"] = [[round(a), round(b)] for a, b in zip(rps2, rps1, strict=True)]
            rows.append(r)
        if "R2" in ids:
            via: list[float] = []
            straight: list[float] = []
            for i in range(rounds):
                sides = [(one.url, via), (direct, straight)]
                for url, out in sides if i % 2 == 0 else sides[::-1]:
                    out.append(wrk_latency(url + "/attention", seconds, script, 1, 1)[1])
            mv, ms = statistics.median(via), statistics.median(straight)
            r = row("R2", R_WHAT["R2"], mv / ms, "≤", R_TARGETS["R2"],
                    f"p50 {mv:.3f} vs {ms:.3f} ms (medians of {rounds} rounds of {seconds} s "
                    "wrk -t1 -c1 on each side, alternating): nginx's keep-alive connection to the "
                    "replica, request body buffered, answer through memory buffers; same machine")  # fmt: skip
            r["runs"] = [[round(a, 3), round(b, 3)] for a, b in zip(via, straight, strict=True)]
            rows.append(r)
        return rows
    finally:
        two.close()
        if one is not None:
            one.close()


def row(rid: str, what: str, value: float, op: str, target: float, detail: str) -> Row:
    met = {"≤": value <= target, "≥": value >= target, "<": value < target}[op]
    return {
        "id": rid,
        "workload": what,
        "value": round(value, 3),
        "target": f"{op} {target}",
        "met": met,
        "detail": detail,
    }


def skipped(rid: str, what: str, why: str, target: str = "") -> Row:
    return {
        "id": rid,
        "workload": what,
        "value": None,
        "target": target,
        "met": None,
        "detail": "skipped: " + why,
    }


E_WHAT = {
    "E1": "explorer, L=2048 weights: Run to first paint ÷ fetch + read of the same answer + a frame",
    "E2": "explorer, L=512 weights: Run to first paint ÷ fetch + read of the same answer + a frame",
    "E3": "explorer, L=2048 drawn: JavaScript heap ÷ the weights' float64 bytes",
}
E_TARGETS = {"E1": 2.5, "E2": 3.0, "E3": 4.0}


def e1_e3(base: str, ids: set[str], runs: int) -> list[Row]:
    """The explorer in Debian's Chromium (benchmarks/explorer.py): drawing ÷ getting the numbers."""
    wanted = [i for i in ("E1", "E2", "E3") if i in ids]
    try:
        import playwright  # noqa: F401
    except ImportError:
        return [
            skipped(i, E_WHAT[i], "playwright is not installed", f"≤ {E_TARGETS[i]}")
            for i in wanted
        ]
    if not Path(explorer.CHROMIUM).exists():
        return [
            skipped(i, E_WHAT[i], f"{explorer.CHROMIUM} is missing", f"≤ {E_TARGETS[i]}")
            for i in wanted
        ]
    got = explorer.measure(base, max(3, runs // 2))
    rows = []
    for rid, length in (("E1", "2048"), ("E2", "512")):
        page, floor = got[length]["page"], got[length]["floor"]
        rows.append(row(rid, E_WHAT[rid], page / floor, "≤", E_TARGETS[rid],
                        f"first paint {page:.0f} ms vs {floor:.0f} ms to fetch and read the "
                        f"safetensors answer and reach the next frame in the same page (medians of {max(3, runs // 2)}, "
                        "alternating; Chromium and the server share this machine's CPUs)"))  # fmt: skip
    heap, weights = got["heap"], got["weights_bytes"]
    rows.append(row("E3", E_WHAT["E3"], heap / weights, "≤", E_TARGETS["E3"],
                    f"{heap / 1e6:.0f} MB heap after a collection for {weights / 1e6:.1f} MB of "
                    "weights (the answer as nested arrays, the page's state; the map's picture "
                    "lives outside the JS heap)"))  # fmt: skip
    return [r for r in rows if r["id"] in ids]


ALL_ROWS = ["P1", "P2", "P3", "P4", "P5", "P6", "P7", "D1", "D2", "D3", "C1", "C2", "S1", "S1t", "B1", "B1j", "B2", "R1", "R2", "E1", "E2", "E3", *model_page.IDS, "M1", *compressed.IDS, *backward.IDS]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7, help="runs per side for medians")
    parser.add_argument("--only", nargs="*", help="row ids to run, e.g. P1 P4")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest.json"))
    args = parser.parse_args()
    want = set(args.only or ALL_ROWS)
    proc, base = start_server(workers=1)
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_") as d:
            tmp = Path(d)
            if want & {"P1", "P3"}:
                rows += [r for r in p1_p3(base, tmp, args.runs) if r["id"] in want]
            if "P2" in want:
                rows.append(p2(base, tmp, 3))
            if "P4" in want:
                rows.append(p4(tmp))
            if "P5" in want:
                rows.append(p5(base, tmp, args.runs))
            if "P6" in want:
                rows.append(p6(max(args.runs, 9)))
            if "P7" in want:
                rows.append(p7(base, tmp, 8.0))
            if want & {"D1", "D2"}:
                rows += [r for r in d1_d2(base, tmp, args.runs) if r["id"] in want]
            if "D3" in want:
                rows.append(d3(base, proc.pid, tmp, args.runs))
            if want & {"C1", "C2"}:
                rows += c1_c2(tmp, want)
            if want & {"S1", "S1t"}:
                rows += s1(base, tmp, want)
            if want & {"B1", "B1j"}:
                rows += b1(base, tmp, want, args.runs)
            if "B2" in want:
                rows.append(b2(tmp))
            if want & {"R1", "R2"}:
                rows += r1_r2(tmp, want)
            if want & {"E1", "E2", "E3"}:
                rows += e1_e3(base, want, args.runs)
            if want & set(model_page.IDS):
                rows += model_page.rows(base, want, row, skipped)
            if "M1" in want:
                rows.append(m1(base, tmp, args.runs, row, skipped))
            if want & set(compressed.IDS):
                rows += compressed.z_rows(
                    base, tmp, args.runs, want, row, skipped, multihead_body(384)
                )
            if want & set(backward.IDS):
                rows += backward.in_process_rows(args.runs, row, skipped, want)
                rows += backward.http_rows(base, tmp, args.runs, row, skipped, want)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"{'id':<4} {'value':>8}  {'target':<8} {'met':<4} workload — detail")
    for r in rows:
        value = "—" if r["value"] is None else f"{r['value']:.3g}"
        met = {True: "yes", False: "NO", None: "—"}[r["met"]]
        print(f"{r['id']:<4} {value:>8}  {r['target']:<8} {met:<4} {r['workload']} — {r['detail']}")
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
