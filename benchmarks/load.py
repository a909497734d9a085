"""`make load`: a bounded load run against a real server on loopback, then a verdict.

32 keep-alive connections for 30 s (by default) send a mix of small requests (the worked
examples) and large ones (L=512 full traces) to a server with 2 workers. Passes when no request
failed or timed out and the server's memory came back near its starting point; prints p50/p99
per kind and writes benchmarks/results/load.json. It sends traffic only to 127.0.0.1 and stops
by itself.
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.live import start_server  # noqa: E402
from service.wire import examples as ex  # noqa: E402

SMALL = [("/attention", ex.I_AM_BATMAN), ("/mask", ex.CAUSAL_FOUR_TOKENS), ("/multihead", ex.TWO_HEADS_FULL_BLOCK),
         ("/mask", ex.PADDED_BATCH), ("/attention", ex.GENERATED_SENTENCE)]  # fmt: skip
LARGE_SHARE = 0.1


def large_request() -> tuple[str, dict[str, Any]]:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(512, 64))
    w = {n: (rng.normal(size=(64, 64)) / 8).tolist() for n in ("w_q", "w_k", "w_v")}
    return "/attention", {"x": x.tolist(), **w, "mask": {"type": "causal"}}


def tree_rss_mb(pid: int) -> float:
    """Resident memory of the server and its worker processes."""
    pids = [pid] + [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    total = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "load.json"))
    args = parser.parse_args()

    large_path, large_body = large_request()
    payloads = [(p, orjson.dumps(b)) for p, b in SMALL]
    large = (large_path, orjson.dumps(large_body))
    proc, base = start_server(workers=args.workers)
    port = int(base.rsplit(":", 1)[1])
    latencies: dict[str, list[float]] = {"small": [], "large": []}
    failures: list[str] = []
    lock = threading.Lock()
    try:
        for path, body in [*payloads, large]:  # warm every worker's code paths once
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", path, body, {"Content-Type": "application/json"})
            c.getresponse().read()
            c.close()
        time.sleep(1.0)
        baseline = tree_rss_mb(proc.pid)
        peak = baseline
        deadline = time.monotonic() + args.seconds

        def client(seed: int) -> None:
            nonlocal peak
            rnd = random.Random(seed)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            while time.monotonic() < deadline:
                kind = "large" if rnd.random() < LARGE_SHARE else "small"
                path, body = large if kind == "large" else rnd.choice(payloads)
                start = time.perf_counter()
                try:
                    conn.request("POST", path, body, {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    data = response.read()
                    if response.status != 200 or not data.endswith(b"}"):
                        raise RuntimeError(f"{path} answered {response.status}")
                except Exception as err:  # a timeout, a reset, a bad status: all count
                    with lock:
                        failures.append(f"{kind} {path}: {err!r}"[:200])
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    continue
                with lock:
                    latencies[kind].append(time.perf_counter() - start)
            conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.connections)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, tree_rss_mb(proc.pid))
            time.sleep(0.25)
        time.sleep(3.0)  # let the workers settle
        after = tree_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")

    result = {
        "seconds": args.seconds,
        "connections": args.connections,
        "workers": args.workers,
        "requests": {k: len(v) for k, v in latencies.items()},
        "failures": len(failures),
        "p50_ms": {k: round(pct(v, 50), 1) for k, v in latencies.items()},
        "p99_ms": {k: round(pct(v, 99), 1) for k, v in latencies.items()},
        "rate_per_s": round(sum(len(v) for v in latencies.values()) / args.seconds, 1),
        "rss_mb": {"baseline": round(baseline), "peak": round(peak), "after": round(after)},
    }
    # "near its baseline": within 64 MB, a few large requests' worth (each holds ~12 MB of arrays)
    memory_ok = after <= baseline + 64
    result["passed"] = not failures and memory_ok and all(latencies.values())
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    for line in failures[:10]:
        print("failure:", line)
    if not memory_ok:
        print(f"memory did not come back: {after:.0f} MB after, {baseline:.0f} MB before")
    print(
        "load run:",
        "PASSED" if result["passed"] else "FAILED",
        f"(median small {statistics.median(latencies['small']) * 1e3:.1f} ms)"
        if latencies["small"]
        else "",
    )
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
