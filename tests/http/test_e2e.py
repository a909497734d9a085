"""End to end: the real server (`python -m service`, uvicorn) on a free loopback port."""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from safetensors.numpy import load, save

from harness.live import http_json, start_server
from service.wire import examples as ex
from tests.conftest import assert_close

pytestmark = pytest.mark.e2e
GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "golden.json").read_text())


LARGE = {"seed": 1, "seq_len": 1500, "d_model": 16, "d_k": 16}  # ≈ 6.8 M numbers, ≈ 130 MB of JSON


def _raw_post(body: dict[str, Any]) -> bytes:
    """A whole POST /attention as bytes, for tests that play the client on a raw socket."""
    data = json.dumps(body).encode()
    head = "POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data


def _connect(base: str) -> socket.socket:
    """A raw connection to the server at ``base``."""
    return socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server(workers=2)
    yield base
    proc.terminate()
    assert proc.wait(timeout=15) == 0


def test_healthz_and_docs(server: str) -> None:
    assert http_json(server + "/healthz") == (200, {"status": "ok", "version": "0.1.0"})
    with urllib.request.urlopen(server + "/docs", timeout=10) as r:
        assert b"swagger" in r.read().lower()
    status, spec = http_json(server + "/openapi.json")
    assert status == 200 and {"/attention", "/mask", "/multihead"} <= set(spec["paths"])


@pytest.mark.parametrize("case", GOLDEN["cases"][:8], ids=[c["name"] for c in GOLDEN["cases"][:8]])
def test_golden_cases_over_http(server: str, case: dict[str, Any]) -> None:
    status, body = http_json(server + case["endpoint"], case["request"])
    assert status == 200
    assert_close(body, case["expected"])


def test_bad_input_over_http(server: str) -> None:
    status, body = http_json(server + "/attention", {**ex.I_AM_BATMAN, "x": [[1, 0], [0]]})
    assert status == 422 and body["errors"][0]["field"] == "x"


def test_multihead_over_http(server: str) -> None:
    status, body = http_json(server + "/multihead", ex.TWO_HEADS_FULL_BLOCK)
    assert status == 200 and len(body["heads"]) == 2


def test_safetensors_both_ways_over_http(server: str) -> None:
    """A 170 KB safetensors body (read off the event loop) and a streamed safetensors answer
    (its length known in advance) hold the numbers of the same request sent and answered as JSON, bit for bit."""
    rng = np.random.default_rng(5)
    arrays = {"x": rng.normal(size=(600, 32)), "w_q": rng.normal(size=(32, 16))}
    arrays |= {"w_k": rng.normal(size=(32, 16)), "w_v": rng.normal(size=(32, 16))}
    raw = save(arrays, metadata={"json": json.dumps({"mask": {"type": "causal"}})})
    assert len(raw) > 16 * 1024
    host, port = server.rsplit(":", 1)[0].removeprefix("http://"), int(server.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection(host, port, timeout=60)
    st = "application/x-safetensors"
    conn.request("POST", "/mask", body=raw, headers={"Content-Type": st, "Accept": st})
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("content-type") == st
    assert answer.getheader("transfer-encoding") is None  # streamed, with its length said first
    data = answer.read()
    assert int(answer.getheader("content-length") or 0) == len(data)
    tensors = load(data)
    conn.close()
    body = {**{k: v.tolist() for k, v in arrays.items()}, "mask": {"type": "causal"}}
    status, as_json = http_json(server + "/mask", body)
    assert status == 200
    assert tensors["weights"].tolist() == as_json["weights"]
    assert np.array_equal(np.isneginf(tensors["masked_scores"]), ~tensors["mask"])
    assert tensors["output"].tolist() == as_json["output"]


_MASK_200 = {"method": "POST", "endpoint": "/mask", "status": "200"}


def _mask_count(server: str) -> list[float]:
    with urllib.request.urlopen(server + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("attention_requests_total")
        and 'endpoint="/mask"' in line
        and 'status="200"' in line
    ]


def _mask_count_per_worker(metrics_dir: Path, scratch: Path) -> dict[str, float]:
    """Each worker's own count of POST /mask → 200, read from its counter_<pid>.db alone: every
    file is copied into a directory of its own and collected there, so nothing is summed."""
    counts: dict[str, float] = {}
    for db in sorted(metrics_dir.glob("counter_*.db")):
        pid = db.stem.removeprefix("counter_")
        alone = scratch / pid
        alone.mkdir(exist_ok=True)
        shutil.copyfile(db, alone / db.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))  # type: ignore[no-untyped-call]
        counts[pid] = registry.get_sample_value("attention_requests_total", _MASK_200) or 0.0
    return counts


def _settled_counts(metrics_dir: Path, scratch: Path, sent: int) -> dict[str, float]:
    """The per-worker counts once they account for every request sent: a worker counts a
    request just after sending its last byte, so the client can be a moment ahead."""
    deadline = time.monotonic() + 5
    while sum((counts := _mask_count_per_worker(metrics_dir, scratch)).values()) < sent:
        assert time.monotonic() < deadline, f"{sent} sent, the workers counted {counts}"
        time.sleep(0.05)
    return counts


def test_metrics_add_up_across_workers(tmp_path: Path) -> None:
    metrics_dir, scratch = tmp_path / "metrics", tmp_path / "scratch"
    metrics_dir.mkdir()
    scratch.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    proc, base = start_server(workers=2, env=env)

    def post_mask(_: int) -> int:  # urllib opens a new connection for every request
        return http_json(base + "/mask", ex.CAUSAL_FOUR_TOKENS)[0]

    try:
        sent, per_worker = 0, dict[str, float]()
        with ThreadPoolExecutor(max_workers=8) as pool:
            for _ in range(25):  # rounds of 16 concurrent requests until both workers got some
                assert list(pool.map(post_mask, range(16))) == [200] * 16
                sent += 16
                per_worker = _settled_counts(metrics_dir, scratch, sent)
                if sum(count > 0 for count in per_worker.values()) >= 2:
                    break
            else:
                pytest.fail(f"only one worker ever served /mask: {per_worker} after {sent} sent")
        assert len(per_worker) == 2 and all(count > 0 for count in per_worker.values()), per_worker
        assert sum(per_worker.values()) == sent
        assert _mask_count(base) == [sent]  # one series: the sum over both workers
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0


def test_sigterm_finishes_the_request_in_flight_then_exits_0() -> None:
    proc, base = start_server(workers=1)
    result: dict[str, Any] = {}
    body = {"seed": 0, "seq_len": 1500, "d_model": 64, "d_k": 64}  # a second or so of work

    def slow_request() -> None:
        result["status"], answer = http_json(base + "/attention", body)
        result["rows"] = len(answer.get("weights", []))

    worker = threading.Thread(target=slow_request)
    worker.start()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    worker.join(timeout=60)
    assert proc.wait(timeout=60) == 0
    assert result == {"status": 200, "rows": 1500}


def test_a_port_in_use_is_named_with_the_command_to_use_another() -> None:
    """`make run` on a busy port: one line naming the port and how to choose another, exit 1,
    and no explorer URL announced first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 1
    assert f"port {port} is in use" in run.stderr
    assert f"make run PORT={port + 1}" in run.stderr
    assert "explorer is at" not in run.stdout + run.stderr


def test_plain_uvicorn_honours_root_path_and_log_level(tmp_path: Path) -> None:
    """`uvicorn service.main:app`, as README offers, reads ATTENTION_ROOT_PATH and
    ATTENTION_LOG_LEVEL too (not only `python -m service`)."""
    log = tmp_path / "server.log"
    env = {**os.environ, "ATTENTION_ROOT_PATH": "/api", "ATTENTION_LOG_LEVEL": "info"}
    proc, base = start_server(env=env, log=log, plain_uvicorn=True)
    try:
        with urllib.request.urlopen(base + "/docs", timeout=10) as r:
            assert "/api/openapi.json" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    access = [entry for entry in lines if entry.get("logger") == "service.access"]
    assert [entry["path"] for entry in access] == ["/healthz", "/docs"]


def _post_raw(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def test_overload_answers_200_or_503_with_retry_after_and_small_requests_pass() -> None:
    """A worker whose memory budget fits one large request at a time, a queue of one: six large
    requests at once get 200s and 503s (never a broken connection), and a small request sent
    meanwhile is answered at once."""
    env = {
        **os.environ,
        "ATTENTION_MEMORY_BUDGET_BYTES": str(30 << 20),  # one request below costs ≈ 19 MiB
        "ATTENTION_QUEUE_LENGTH": "1",
        "ATTENTION_QUEUE_WAIT_SECONDS": "20",
    }
    proc, base = start_server(workers=1, env=env)
    large = {"seed": 1, "seq_len": 600, "d_model": 16, "d_k": 16}
    try:
        with ThreadPoolExecutor(max_workers=7) as pool:
            answers = [pool.submit(_post_raw, base + "/attention", large) for _ in range(6)]
            time.sleep(0.05)
            start = time.perf_counter()
            small = _post_raw(base + "/attention", ex.I_AM_BATMAN)
            small_seconds = time.perf_counter() - start
            results = [a.result() for a in answers]
        statuses = sorted(status for status, _, _ in results)
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 2, statuses
        assert 503 in statuses, statuses
        for status, headers, raw in results:
            if status == 503:
                assert headers["retry-after"] == "2"
                assert json.loads(raw)["errors"][0]["type"] == "overloaded"
            else:
                assert len(json.loads(raw)["weights"]) == 600
        assert small[0] == 200 and small_seconds < 1.0
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        rejected = [
            line for line in text.splitlines() if line.startswith("attention_rejected_total")
        ]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in rejected) == statuses.count(503)
        assert "attention_budget_bytes 3.145728e+07" in text
        assert "attention_budget_in_use_bytes 0.0" in text  # everything given back
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_client_that_leaves_mid_answer_gives_its_memory_back() -> None:
    env = {**os.environ, "ATTENTION_MEMORY_BUDGET_BYTES": str(400 << 20)}
    proc, base = start_server(workers=1, env=env)
    try:
        with _connect(base) as sock:
            sock.sendall(_raw_post(LARGE))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # the answer has started
            in_use = _gauge(base, "attention_budget_in_use_bytes")
            assert in_use > 100 << 20  # ≈ 16 bytes × 6.8 M numbers, held while streaming
        deadline = time.monotonic() + 10
        while _gauge(base, "attention_budget_in_use_bytes") != 0.0:
            assert time.monotonic() < deadline, "the budget was not given back"
            time.sleep(0.1)
        while _count(base, 'status="499"') != 1:  # logged as a client that left, not a 200
            assert time.monotonic() < deadline, "the departed client was not counted as 499"
            time.sleep(0.1)
        assert _count(base, 'status="200"') == 0
        assert http_json(base + "/attention", ex.I_AM_BATMAN)[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_whole_answer_nobody_reads_stays_counted_until_it_has_left() -> None:
    """An answer sent in one piece (between INLINE_NUMBERS and WHOLE_NUMBERS) lands in the
    connection's buffer at once: its memory is counted until the client has taken it (or has
    gone), not given back the moment it is handed to the server."""
    env = {**os.environ, "ATTENTION_MEMORY_BUDGET_BYTES": str(400 << 20)}
    proc, base = start_server(workers=1, env=env)
    whole = {"seed": 1, "seq_len": 512, "d_model": 64, "d_k": 64}  # ≈ 0.8 M numbers, 18 MB
    try:
        with _connect(base) as sock:
            sock.sendall(_raw_post(whole))
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200")
            time.sleep(1.0)  # long enough for the whole answer to have been written: more than
            assert _gauge(base, "attention_budget_in_use_bytes") > 8 << 20  # the kernel holds
            head, _, answer = answer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(answer) < length:  # now read it all: the memory goes back
                piece = sock.recv(1 << 20)
                assert piece, "the connection closed mid-answer"
                answer += piece
            assert len(json.loads(answer)["weights"]) == 512
        assert _gauge(base, "attention_budget_in_use_bytes") == 0.0
        with _connect(base) as sock:  # a client that leaves without reading: it comes back too
            sock.sendall(_raw_post(whole))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            time.sleep(1.0)
            assert _gauge(base, "attention_budget_in_use_bytes") > 8 << 20
        deadline = time.monotonic() + 10
        while _gauge(base, "attention_budget_in_use_bytes") != 0.0:
            assert time.monotonic() < deadline, "the budget was not given back"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _gauge(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_client_that_leaves_while_its_answer_is_computed_stops_the_work(tmp_path: Path) -> None:
    """The work stops at the next step (logged and counted as 499, not 500 or 200) and its
    memory is given back; the same for a client that leaves during its upload. A departure is
    no error: nothing is logged at error level (no "Exception in ASGI application")."""
    log = tmp_path / "server.log"
    proc, base = start_server(workers=1, log=log)
    request = _raw_post(
        {"seed": 1, "seq_len": 3000, "d_model": 64, "d_k": 64, "include": ["output"]}
    )
    try:
        with _connect(base) as sock:
            sock.sendall(request)
            time.sleep(0.1)  # computing now (a few tenths of a second of work)
        for delay in (0.05, 0.1):  # gone while computing: the answer is then never written
            with _connect(base) as sock:
                sock.sendall(request)
                time.sleep(delay)
        with _connect(base) as sock:
            sock.sendall(request[: request.index(b"\r\n\r\n") + 104])  # leaves during the upload
        deadline = time.monotonic() + 10
        while _count(base, 'status="499"') < 4:
            assert time.monotonic() < deadline, (
                "the departed clients were not counted as 499: "
                + ", ".join(s + ": " + str(_count(base, 'status="' + s + '"')) for s in STATUSES)
            )
            time.sleep(0.1)
        assert _count(base, 'status="500"') == 0 and _count(base, 'status="200"') == 0
        assert _gauge(base, "attention_budget_in_use_bytes") == 0.0
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    errors = [line for line in log.read_text().splitlines() if '"level":"error"' in line]
    assert not errors, errors[0][:600]


STATUSES = ("200", "499", "500", "503")


def _count(base: str, label: str) -> float:
    """attention_requests_total for POST /attention with ``label``."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in r.read().decode().splitlines()
            if line.startswith("attention_requests_total") and label in line
            and 'endpoint="/attention"' in line
        )  # fmt: skip


def _workers(pid: int) -> set[int]:
    """The uvicorn worker processes under ``pid`` (the supervisor also runs other children)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()}


def test_a_worker_killed_mid_request_is_replaced_and_the_other_keeps_serving() -> None:
    proc, base = start_server(workers=2)
    try:
        deadline = time.monotonic() + 20
        while len(workers := _workers(proc.pid)) < 2:
            assert time.monotonic() < deadline, workers
            time.sleep(0.1)
        victim = min(workers)
        slow = {"seed": 1, "seq_len": 2500, "d_model": 64, "d_k": 64, "include": ["output"]}
        outcomes: list[int | str] = []
        with ThreadPoolExecutor(max_workers=4) as pool:
            pending = [pool.submit(_post_raw, base + "/attention", slow) for _ in range(4)]
            time.sleep(0.3)
            os.kill(victim, signal.SIGKILL)
            for future in pending:
                try:
                    outcomes.append(future.result()[0])
                except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
                    outcomes.append("broken")  # the killed worker's own requests: SIGKILL
        assert set(outcomes) <= {200, "broken"}, outcomes
        assert [http_json(base + "/attention", ex.I_AM_BATMAN)[0] for _ in range(20)] == [200] * 20
        deadline = time.monotonic() + 30
        while len(now := _workers(proc.pid)) != 2 or victim in now:  # a new worker replaces it
            assert time.monotonic() < deadline, f"no replacement for {victim}: {now}"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_stop_that_must_cut_an_answer_exits_1_and_logs_it_as_cut(tmp_path: Path) -> None:
    """SIGTERM while a slow reader is still receiving a large answer: after the grace period the
    answer is cut, its log line says so (not 200), and the stop exits 1 (a clean one exits 0:
    test_sigterm_finishes_the_request_in_flight_then_exits_0)."""
    env = {**os.environ, "ATTENTION_GRACEFUL_SECONDS": "1"}
    log = tmp_path / "server.log"
    proc, base = start_server(env=env, log=log)
    try:
        with _connect(base) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(_raw_post(LARGE))
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # then reads nothing more
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    access = [e for e in lines if e.get("logger") == "service.access" and e["path"] == "/attention"]
    assert [(e["status"], e["outcome"]) for e in access] == [(503, "cut")]


def test_a_client_that_leaves_while_queued_gives_up_its_place() -> None:
    env = {**os.environ, "ATTENTION_MEMORY_BUDGET_BYTES": str(140 << 20)}  # one request below
    proc, base = start_server(workers=1, env=env)
    request = _raw_post(LARGE)
    try:
        with _connect(base) as holder:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            holder.sendall(request)
            assert holder.recv(1024).startswith(b"HTTP/1.1 200")  # holds the budget, reads no more
            with _connect(base) as queued:
                queued.sendall(request)
                deadline = time.monotonic() + 10
                while _gauge(base, "attention_waiting") != 1.0:
                    assert time.monotonic() < deadline, "the second request never queued"
                    time.sleep(0.05)
            deadline = time.monotonic() + 10  # it left: its place in the queue is given up
            while _gauge(base, "attention_waiting") != 0.0 or _count(base, 'status="499"') != 1:
                assert time.monotonic() < deadline, "the departed client kept its place"
                time.sleep(0.05)
            in_use = _gauge(base, "attention_budget_in_use_bytes")
            assert 0 < in_use < 140 << 20  # only the holder's share
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_memory_goes_back_while_the_answer_streams_out() -> None:
    """Each output's share of the budget comes back once it is written, not only at the end: a
    reader halfway through a large answer holds well under its request's cost."""
    proc, base = start_server(workers=1)
    try:
        with _connect(base) as sock:
            sock.sendall(_raw_post(LARGE))
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            cost = _gauge(base, "attention_budget_in_use_bytes")
            assert cost > 100 << 20  # ≈ 16 bytes × 6.8 M numbers
            received, lowest = len(first), cost
            while lowest > cost / 2:  # read on, a few MB at a time, until half has come back
                chunk = sock.recv(1 << 20)
                assert chunk, f"the answer ended with {lowest:,.0f} of {cost:,.0f} bytes held"
                received += len(chunk)
                if received % (8 << 20) < len(chunk):
                    lowest = _gauge(base, "attention_budget_in_use_bytes")
            assert received < 100 << 20  # the answer (≈ 130 MB) is far from over
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_parser_processes_end_with_their_worker() -> None:
    """A worker's parser process (large bodies) ends when the worker stops, or is killed:
    nothing is left behind."""
    row = [1.2345678901234567] * 32  # 2,048 rows of them: over 1 MiB of JSON
    body = {"q": [row] * 2048, "k": [row], "v": [[1.0] * 8]}
    proc, base = start_server(workers=2)
    try:
        deadline = time.monotonic() + 20
        while len(parsers := [p for w in _workers(proc.pid) for p in _children(w)]) < 2:
            assert time.monotonic() < deadline, f"no parser process under each worker: {parsers}"
            assert http_json(base + "/attention", {**body, "include": ["output"]})[0] == 200
        victim = min(_workers(proc.pid))
        orphan = _children(victim)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{p}").exists() for p in orphan):
            assert time.monotonic() < deadline, f"{orphan} outlived their killed worker"
            time.sleep(0.2)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while alive := [p for p in parsers if Path(f"/proc/{p}").exists()]:
        assert time.monotonic() < deadline, f"{alive} outlived the server"
        time.sleep(0.2)
