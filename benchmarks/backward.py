"""Rows G1–G6 of `make bench` (benchmarks/run.py): what the backward pass costs (issue 44).

In process, the math alone (no HTTP, no JSON), each side's answer checked against the other to
1e-10 before anything is timed:

- G1: /attention's computation at L = S = 512, d_k = d_v = 64, float64: the service's core
  forward and backward (``scaled_dot_product_attention`` then ``attention_backward`` from a
  given dO) ÷ torch's of the same (softmax(Q Kᵀ/√d_k) V, then ``out.backward(dO)`` with Q, K, V
  requiring gradients), on the same threads.
- G2: /multihead's at L = 512, d_model = 256, h = 4 (d_k = 64), W_o: ``multihead_attention``
  then ``multihead_backward`` (every head's intermediates, then W_q, W_k, W_v, W_o and x)
  ÷ torch autograd of the same block (x, the four weights requiring gradients).

G1 and G2 are timed in a child process with one thread a side (BLAS and torch): on a machine
whose cores other work shares, two threads each stall on one another (torch's OpenMP threads
most); the detail gives the bench's thread count too, in this process.

On the bench's server, end to end with curl (the answer asked as safetensors, received whole
and discarded), the same sizes:

- G3/G4: POST /attention (G3) and /multihead (G4) with ``grad_output`` ÷ the same request
  without it (the goal: the backward at most triples the request's time), each asking
  (``include``) for the output and, with grad_output, the inputs' gradients (q, k, v; x and
  the four weights), so that computing dominates; the detail gives the same ratio with every
  output (every intermediate and its gradient: 15 and 87 MB), where writing the answer does.
- G5/G6: the same backward requests ÷ torch autograd's forward and backward in the bench's
  process on one thread (G1's and G2's torch side, its steadiest and lowest time here): what
  HTTP, parsing, the steps' texts and the answer cost beside the math; a measurement, no goal.

The sides alternate; medians, the best pair and the pairs' median are in the detail. A server
without ``grad_output`` (a 422 naming it) skips G3–G6 and says so.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
L, D_K = 512, 64  # G1, G3, G5
D_MODEL, HEADS = 256, 4  # G2, G4, G6: d_k = 64 per head
IDS = ["G1", "G2", "G3", "G4", "G5", "G6"]
WHAT = {
    "G1": f"attention forward + backward L={L} d_k={D_K} float64 in process, 1 thread: the "
    "core ÷ torch autograd",
    "G2": f"multihead forward + backward L={L} d_model={D_MODEL} h={HEADS} with W_o in process, "
    "1 thread: the core ÷ torch autograd",
    "G3": f"POST /attention L={L} d_k={D_K} with grad_output ÷ the same request without "
    "(include: output, grad_q, grad_k, grad_v)",
    "G4": f"POST /multihead L={L} d_model={D_MODEL} h={HEADS} with grad_output ÷ the same "
    "request without (include: output, grad_x, grad_w_q, grad_w_k, grad_w_v, grad_w_o)",
    "G5": f"POST /attention L={L} d_k={D_K} with grad_output, end to end ÷ torch autograd "
    "forward + backward in process",
    "G6": f"POST /multihead L={L} d_model={D_MODEL} h={HEADS} with grad_output, end to end ÷ "
    "torch autograd forward + backward in process",
}
TARGETS: dict[str, tuple[str, float]] = {
    "G1": ("≤", 1.5),
    "G2": ("≤", 1.5),
    "G3": ("≤", 3.0),
    "G4": ("≤", 3.0),
}
TOLERANCE = 1e-10

Arrays = dict[str, np.ndarray[Any, Any]]
Timer = Callable[[], float]


def attention_inputs(seed: int = 0) -> Arrays:
    """Q, K, V (L × d_k) and dO (L × d_v), standard normal."""
    rng = np.random.default_rng(seed)
    return {n: rng.normal(size=(L, D_K)) for n in ("q", "k", "v", "grad_output")}


def multihead_inputs(seed: int = 1) -> Arrays:
    """x (L × d_model), W_q, W_k, W_v, W_o (in_out, d_model × d_model, scaled so the scores
    are of order 1) and dO (L × d_model)."""
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.normal(size=(L, D_MODEL)), "grad_output": rng.normal(size=(L, D_MODEL))}
    for n in ("w_q", "w_k", "w_v", "w_o"):
        arrays[n] = rng.normal(size=(D_MODEL, D_MODEL)) / 16
    return arrays


# ------------------------------------------------------------------------- the two sides


def core_attention(a: Arrays) -> Arrays:
    """The service's core: the forward, then its backward from dO."""
    from service.core.attention import scaled_dot_product_attention
    from service.core.backward import attention_backward

    q, k, v = (a[n][None] for n in ("q", "k", "v"))
    trace = scaled_dot_product_attention(q, k, v)
    grads = attention_backward(trace, a["grad_output"][None])
    return {n: grads[f"grad_{n}"][0] for n in ("q", "k", "v")}


def core_multihead(a: Arrays) -> Arrays:
    """The service's core: multihead_attention, then multihead_backward from dO."""
    from service.core.backward import multihead_backward
    from service.core.multihead import MultiheadWeights, multihead_attention

    x = a["x"][None]
    weights = MultiheadWeights(a["w_q"], a["w_k"], a["w_v"], w_o=a["w_o"])
    trace = multihead_attention(x, weights, num_heads=HEADS)
    grads = multihead_backward(x, weights, trace, a["grad_output"][None], num_kv_heads=HEADS)
    return {"x": grads["grad_x"][0]} | {n: grads[f"grad_{n}"] for n in ("w_q", "w_k", "w_v", "w_o")}


def torch_attention(a: Arrays) -> Arrays:
    """torch autograd, float64: softmax(Q Kᵀ/√d_k) V, then backward from dO."""
    import torch

    q, k, v = (torch.from_numpy(a[n]).requires_grad_() for n in ("q", "k", "v"))
    out: Any = torch.softmax(q @ k.T / D_K**0.5, dim=-1) @ v
    out.backward(torch.from_numpy(a["grad_output"]))
    return {n: t.grad.numpy() for n, t in (("q", q), ("k", k), ("v", v)) if t.grad is not None}


def torch_multihead(a: Arrays) -> Arrays:
    """torch autograd, float64: the heads of x W_q, x W_k, x W_v, each softmax(Q Kᵀ/√d_k) V,
    concatenated, times W_o; then backward from dO."""
    import torch

    t = {n: torch.from_numpy(a[n]).requires_grad_() for n in ("x", "w_q", "w_k", "w_v", "w_o")}
    d = D_MODEL // HEADS

    def heads(m: Any) -> Any:
        return m.reshape(L, HEADS, d).transpose(0, 1)  # (h, L, d)

    q, k, v = (heads(t["x"] @ t[n]) for n in ("w_q", "w_k", "w_v"))
    out = torch.softmax(q @ k.transpose(1, 2) / d**0.5, dim=-1) @ v
    projected = out.transpose(0, 1).reshape(L, D_MODEL) @ t["w_o"]
    projected.backward(torch.from_numpy(a["grad_output"]))
    return {n: x.grad.numpy() for n, x in t.items() if x.grad is not None}


def agree(ours: Arrays, theirs: Arrays) -> float:
    """The largest difference between the two sides' gradients, relative to each array's
    largest entry; an AssertionError above TOLERANCE (a bench of a wrong answer is no bench)."""
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    worst = max(
        float(np.abs(ours[n] - theirs[n]).max() / max(np.abs(theirs[n]).max(), 1e-300))
        for n in ours
    )
    assert worst <= TOLERANCE, f"the core's gradients differ from torch's by {worst:.2g}"
    return worst


# ------------------------------------------------------------------------------- timing


def timer(fn: Callable[[], object]) -> Timer:
    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def pairs(a: Timer, b: Timer, runs: int) -> tuple[list[float], list[float]]:
    """``runs`` timings of each side, interleaved (the side going first swapped each run)."""
    xs: list[float] = []
    ys: list[float] = []
    for i in range(runs):
        if i % 2:
            ys.append(b())
            xs.append(a())
        else:
            xs.append(a())
            ys.append(b())
    return xs, ys


def summary(xs: list[float], ys: list[float]) -> tuple[float, str]:
    """median(xs) ÷ median(ys), and the detail's "medians …, best pair …, pairs' median …"."""
    mx, my = statistics.median(xs), statistics.median(ys)
    ratios = [x / y for x, y in zip(xs, ys, strict=True)]
    text = (
        f"{mx * 1e3:.1f} vs {my * 1e3:.1f} ms (medians of {len(xs)}, alternating); best pair "
        f"{min(ratios):.2f}, pairs' median {statistics.median(ratios):.2f}"
    )
    return mx / my, text


SIDES = {
    "G1": (attention_inputs, core_attention, torch_attention),
    "G2": (multihead_inputs, core_multihead, torch_multihead),
}
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def measure(rid: str, runs: int) -> dict[str, Any]:
    """In this process: the two sides' answers compared, then ``runs`` interleaved timings of
    each (torch on as many threads as the thread variables give NumPy's BLAS)."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    make, ours, theirs = SIDES[rid]
    inputs = make()
    worst = agree(ours(inputs), theirs(inputs))
    mine, torch_side = pairs(timer(partial(ours, inputs)), timer(partial(theirs, inputs)), runs)
    return {"ours": mine, "theirs": torch_side, "worst": worst, "threads": torch.get_num_threads()}


def single_threaded(rid: str, runs: int) -> dict[str, Any]:
    """:func:`measure` in a child process whose BLAS and torch run one thread each (the thread
    variables are read when NumPy loads): the math side by side, which the machine's other
    load touches far less than two threads each contending for the same two cores."""
    env = os.environ | {var: "1" for var in THREAD_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    out = subprocess.run(
        [sys.executable, __file__, rid, str(runs)], env=env, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    got: dict[str, Any] = json.loads(out)
    return got


def in_process_rows(
    runs: int, row: Callable[..., Any], skipped: Callable[..., Any], ids: set[str]
) -> list[Any]:
    """G1 and G2 (whichever ``ids`` names): the value one thread a side; the detail adds the
    bench's thread count, measured in this process."""
    try:
        import torch  # noqa: F401
    except ImportError:
        why = "torch is not installed (pip install torch==2.13.0)"
        return [skipped(i, WHAT[i], why, target_text(i)) for i in ("G1", "G2") if i in ids]
    rows = []
    for rid in ("G1", "G2"):
        if rid not in ids:
            continue
        one = single_threaded(rid, runs)
        ratio, text = summary(one["ours"], one["theirs"])
        many = measure(rid, runs)
        _, many_text = summary(many["ours"], many["theirs"])
        op, target = TARGETS[rid]
        rows.append(row(rid, WHAT[rid], ratio, op, target,
                        f"core vs torch, 1 thread each: {text}; on {many['threads']} threads: "
                        f"{many_text}; the gradients agree to {one['worst']:.1g} relative"))  # fmt: skip
    return rows


# ------------------------------------------------------------------------------ over HTTP

SAFETENSORS = "application/x-safetensors"


def post(url: str, body: Path, out: str = os.devnull) -> tuple[int, float]:
    """curl's status and seconds for ``body`` posted to ``url``, the answer asked as safetensors
    (as the Python client asks) and written to ``out`` (discarded by default)."""
    start = time.perf_counter()
    status = subprocess.run(
        ["curl", "-s", "-o", out, "-w", "%{http_code}", "-H", "Content-Type: application/json",
         "-H", f"Accept: {SAFETENSORS}", "--data-binary", f"@{body}", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(status), time.perf_counter() - start


SERVICE_NAMES = {"G3": ("q", "k", "v"), "G4": ("x", "w_q", "w_k", "w_v", "w_o")}
Bodies = dict[
    str, Path
]  # "plain", "grad" (include: the last array, and the inputs' gradients), "plain_all", "grad_all"


def bodies(tmp: Path) -> dict[str, tuple[str, Bodies, Arrays]]:
    """Per endpoint: its path, its four requests (without and with grad_output; answering the
    last array and the inputs' gradients, or every output) and the inputs."""
    a, m = attention_inputs(), multihead_inputs()
    plain_attention = {n: a[n].tolist() for n in ("q", "k", "v")}
    plain_multihead = {n: m[n].tolist() for n in ("x", "w_q", "w_k", "w_v", "w_o")}
    plain_multihead["num_heads"] = HEADS
    out = {}
    for rid, path, plain, inputs in (
        ("G3", "/attention", plain_attention, a),
        ("G4", "/multihead", plain_multihead, m),
    ):
        grad = plain | {"grad_output": inputs["grad_output"].tolist()}
        last = ["output"]
        grads = last + [f"grad_{n}" for n in SERVICE_NAMES[rid]]
        files: Bodies = {}
        for name, body in (("plain", plain | {"include": last}), ("grad", grad | {"include": grads}),
                           ("plain_all", plain), ("grad_all", grad)):  # fmt: skip
            files[name] = tmp / f"{rid}-{name}.json"
            files[name].write_text(json.dumps(body))
        out[rid] = (path, files, inputs)
    return out


def checked(url: str, body: Path, inputs: Arrays, rid: str, tmp: Path) -> str | None:
    """The service's gradients for ``body`` checked against torch's (TOLERANCE, relative):
    None when they agree; why not, when the server does not take ``grad_output``."""
    from safetensors.numpy import load

    answer = tmp / f"{rid}.out"
    status, _ = post(url, body, str(answer))
    if status == 422 and b"grad_output" in answer.read_bytes():
        return "this server does not take grad_output (a 422 naming it)"
    assert status == 200, f"{url} answered {status}: {answer.read_bytes()[:300]!r}"
    got = load(answer.read_bytes())
    theirs = torch_attention(inputs) if rid == "G3" else torch_multihead(inputs)
    agree({n: got[f"grad_{n}"] for n in SERVICE_NAMES[rid]}, theirs)
    return None


def served(url: str, body: Path) -> float:
    """Seconds for a request that must succeed."""
    status, seconds = post(url, body)
    assert status == 200, f"{url} answered {status}"
    return seconds


def target_text(rid: str) -> str:
    """A row's goal as run.py writes it ("≤ 3.0"), "" for a measurement."""
    return " ".join(map(str, TARGETS[rid])) if rid in TARGETS else ""


def http_rows(
    base: str,
    tmp: Path,
    runs: int,
    row: Callable[..., Any],
    skipped: Callable[..., Any],
    ids: set[str],
) -> list[Any]:
    """G3–G6 (whichever ``ids`` names) on the bench's server at ``base``."""
    import torch

    torch.set_num_threads(1)  # its steadiest time on a shared machine (G1, G2), and its lowest
    rows: list[Any] = []
    for rid, (path, files, inputs) in bodies(tmp).items():
        mine = [i for i in (rid, f"G{int(rid[1]) + 2}") if i in ids]
        if not mine:
            continue
        url = base + path
        why = checked(url, files["grad_all"], inputs, rid, tmp)
        if why is not None:
            rows += [skipped(i, WHAT[i], why, target_text(i)) for i in mine]
            continue
        size = (tmp / f"{rid}.out").stat().st_size / 1e6
        for body in files.values():
            post(url, body)  # first calls are not measured
        reference = torch_attention if rid == "G3" else torch_multihead
        sides: dict[str, Timer] = {n: partial(served, url, body) for n, body in files.items()}
        sides["torch"] = timer(partial(reference, inputs))
        times: dict[str, list[float]] = {n: [] for n in sides}
        order = list(sides)
        for i in range(runs):  # the sides in turn, the order rotated each run
            for name in order[i % len(order) :] + order[: i % len(order)]:
                times[name].append(sides[name]())
        _, every = summary(times["grad_all"], times["plain_all"])
        if rid in ids:
            ratio, text = summary(times["grad"], times["plain"])
            op, target = TARGETS[rid]
            rows.append(row(rid, WHAT[rid], ratio, op, target,
                            f"with vs without {text}; include the output and the inputs' "
                            f"gradients ({', '.join(SERVICE_NAMES[rid])}), answered as "
                            f"safetensors; with every output (a {size:.1f} MB answer): {every}; "
                            f"the gradients checked against torch autograd to {TOLERANCE:g} "
                            "first"))  # fmt: skip
        rid2 = f"G{int(rid[1]) + 2}"
        if rid2 in ids:
            ratio, text = summary(times["grad"], times["torch"])
            _, all_text = summary(times["grad_all"], times["torch"])
            rows.append(info(rid2, WHAT[rid2], ratio,
                             f"service (the output and the inputs' gradients) vs torch on 1 "
                             f"thread {text}; with every output and gradient ({size:.1f} MB): "
                             f"{all_text}"))  # fmt: skip
    return sorted((r for r in rows if r["id"] in ids), key=lambda r: IDS.index(r["id"]))


def info(rid: str, what: str, value: float, detail: str) -> dict[str, Any]:
    """A measured row with no goal (run.py's row shape; ``met`` None)."""
    return {"id": rid, "workload": what, "value": round(value, 3), "target": "",
            "met": None, "detail": detail}  # fmt: skip


if __name__ == "__main__":  # single_threaded's child: python benchmarks/backward.py G1 7
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]))))
