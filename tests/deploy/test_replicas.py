"""Replicas behind a real nginx (deploy/nginx/nginx.conf.template, harness/replicas.py), on
loopback with processes: a replica killed with SIGKILL and another restarted under load cost the
client nothing, and a 503 from every replica reaches the client with its Retry-After.

Skipped when nginx is not installed, unless REQUIRE_NGINX is set (CI), then failed."""

import http.client
import json
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from harness.replicas import Replica, Replicas
from service.wire.examples import I_AM_BATMAN, TWO_HEADS_FULL_BLOCK

pytestmark = [pytest.mark.e2e, pytest.mark.needs("nginx")]  # skipped before any fixture


def rows_sum_to_one(weights: Any, tol: float) -> bool:
    """Every row of a (possibly nested) weights array sums to 1."""
    if weights and isinstance(weights[0], (int, float)):
        return math.isclose(sum(weights), 1.0, abs_tol=tol)
    return bool(weights) and all(rows_sum_to_one(w, tol) for w in weights)


class Load:
    """``threads`` clients, each on its own keep-alive connection to nginx, sending small
    requests back to back (every 4th a /multihead) and checking every answer: status 200 and
    weights whose rows sum to 1. Anything else, an exception included, is a failure."""

    BODIES = (
        ("/attention", json.dumps(I_AM_BATMAN).encode(), 1e-9),
        ("/attention", json.dumps(I_AM_BATMAN).encode(), 1e-9),
        ("/attention", json.dumps(I_AM_BATMAN).encode(), 1e-9),
        ("/multihead", json.dumps(TWO_HEADS_FULL_BLOCK).encode(), 1e-3),  # decimals 4
    )

    def __init__(self, port: int, threads: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok: Counter[str] = Counter()
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, seed: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        i = seed
        while not self.stop.is_set():
            path, body, tol = self.BODIES[i % len(self.BODIES)]
            i += 1
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    raise AssertionError(f"{r.status} {data[:300]!r}")
                weights = json.loads(data)["weights"]
                if not rows_sum_to_one(weights, tol):
                    raise AssertionError(f"weights rows do not sum to 1: {weights}")
            except Exception as err:  # every kind of failure is counted
                with self.lock:
                    self.failures.append(f"{path}: {type(err).__name__}: {err}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                continue
            with self.lock:
                self.ok[path] += 1
        conn.close()

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def test_kill_and_restart_under_load_cost_the_client_nothing() -> None:
    """3 replicas behind nginx under 6 client threads; replica 0 SIGKILLed at ~3 s, replica 1
    stopped (SIGTERM) at ~5 s and started again on its port; the load runs until the restarted
    replica has served requests of its own (at least 12 s in all). Zero failed requests, and
    every replica's own /metrics counted 200s for POST /attention."""
    with Replicas(3) as cluster:
        start = time.monotonic()
        with Load(cluster.port, threads=6) as load:
            time.sleep(3)
            before_kill = cluster.served(0)
            cluster.kill(0)
            time.sleep(2)
            before_stop = cluster.served(1)
            stop_status = cluster.stop(1)
            cluster.start(1)
            restarted = time.monotonic()
            # nginx marked it failed while it was down (max_fails=3 fail_timeout=5s): it gets
            # requests again once fail_timeout has passed
            while time.monotonic() - restarted < 30:
                if time.monotonic() - start >= 12 and cluster.served(1) >= 20:
                    break
                time.sleep(0.5)
        elapsed = time.monotonic() - start
        counts = {
            "0 (killed)": before_kill,
            "1 (before its stop)": before_stop,
            "1 (after its restart)": cluster.served(1),
            "2": cluster.served(2),
        }
        attempts = cluster.upstream_attempts()
        retried = [a for a in attempts if len(a) > 1]
        summary = (
            f"{sum(load.ok.values())} answers in {elapsed:.1f} s ({dict(load.ok)}), "
            f"{len(load.failures)} failures; per replica /attention 200s {counts}; nginx sent "
            f"{len(retried)} of {len(attempts)} requests again ({Counter(map(tuple, retried))})"
        )
        print(summary)
        assert not load.failures, f"{summary}; first failures: {load.failures[:5]}"
        assert stop_status == 0, f"replica 1's SIGTERM stop exited {stop_status}: cut answers"
        assert sum(load.ok.values()) >= 100, summary
        assert load.ok["/multihead"] > 0, summary
        assert all(n > 0 for n in counts.values()), summary


BUDGET = 20 * 2**20  # one L=512 request (≈ 17 MiB of cost) fits; a second does not


def big_body() -> bytes:
    """/attention L=512 d_model=64, every output: about 17 MiB of budget, an 18 MB answer."""
    rng = np.random.default_rng(0)
    body = {n: rng.normal(size=(512 if n == "x" else 64, 64)).tolist() for n in ("x", "w_q", "w_k", "w_v")}  # fmt: skip
    return json.dumps(body).encode()


@pytest.fixture
def busy_replicas() -> Iterator[Replicas]:
    """2 replicas with a small memory budget and no queue (ATTENTION_QUEUE_LENGTH=0)."""
    env = {"ATTENTION_MEMORY_BUDGET_BYTES": str(BUDGET), "ATTENTION_QUEUE_LENGTH": "0"}
    with Replicas(2, env=env) as cluster:
        yield cluster


def hold_the_budget(replica: Replica, body: bytes) -> socket.socket:
    """Send ``body`` straight to ``replica`` and read nothing of its answer: the unsent part of
    the answer keeps most of the budget taken. Returns once the replica reports it in use."""
    s = socket.create_connection(("127.0.0.1", replica.port), timeout=30)
    head = f"POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    s.sendall(head.encode() + body)
    deadline = time.monotonic() + 30
    while True:
        in_use = [line for line in replica.metrics().splitlines()
                  if line.startswith("attention_budget_in_use_bytes")]  # fmt: skip
        if in_use and float(in_use[0].split()[-1]) > BUDGET / 4:
            return s
        assert time.monotonic() < deadline, f"the held request never took the budget: {in_use}"
        time.sleep(0.1)


def test_503_from_every_replica_reaches_the_client_with_retry_after(
    busy_replicas: Replicas,
) -> None:
    """Each replica's budget is taken by a request whose answer nobody reads; the same request
    through nginx gets 503 from one replica, then from the other, and the client gets the
    last one: its Retry-After, its JSON."""
    body = big_body()
    held = [hold_the_budget(r, body) for r in busy_replicas.replicas]
    logged = len(busy_replicas.upstream_attempts())  # nginx's access lines before these
    try:
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", busy_replicas.port, timeout=60)
            try:
                conn.request("POST", "/attention", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                answer = json.loads(r.read())
            finally:
                conn.close()
            assert r.status == 503, (r.status, str(answer)[:300])
            assert r.getheader("Retry-After") == "2", r.msg.as_string()
            assert answer["errors"][0]["type"] == "overloaded", answer
            assert "queue for memory is full" in answer["message"], answer  # the service's own
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10  # nginx logs a request after its answer has gone out
    while len(attempts := busy_replicas.upstream_attempts()) < logged + 3:
        assert time.monotonic() < deadline, f"nginx logged {attempts[logged:]}"
        time.sleep(0.1)
    print(f"nginx's attempts: {attempts[logged:]}")
    assert attempts[logged:] == [["503", "503"]] * 3, attempts  # both replicas, every time


@pytest.fixture(scope="module")
def one_replica() -> Iterator[Replicas]:
    with Replicas(1) as replicas:
        yield replicas


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)


def test_an_http10_request_without_host_passes_through_nginx(one_replica: Replicas) -> None:
    """HTTP/1.0 needs no Host; the replica, spoken to in HTTP/1.1, gets one from nginx."""
    answer = _raw(one_replica.port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


@pytest.mark.parametrize("given", ["has spaces in it", "x" * 129, "sane-id-42"])
def test_nginx_and_the_replica_log_the_same_request_id(one_replica: Replicas, given: str) -> None:
    """The id in the answer is the one in nginx's access log and in the replica's: the client's
    when the service would keep it, else nginx's own (never two different ids)."""
    request = (
        f"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-ID: {given}\r\n\r\n"
    )
    head = _raw(one_replica.port, request.encode()).split(b"\r\n\r\n")[0].decode()
    answered = next(v.strip() for n, v in (h.split(":", 1) for h in head.splitlines()[1:])
                    if n.lower() == "x-request-id")  # fmt: skip
    assert (answered == given) == (given == "sane-id-42")
    deadline = time.monotonic() + 10  # both log a request after its answer has gone out
    replica_log = one_replica.replicas[0].logs[-1]
    while f"id={answered} " not in one_replica.access_log.read_text():
        assert time.monotonic() < deadline, f"nginx did not log id={answered}"
        time.sleep(0.1)
    while f'"request_id":"{answered}"' not in replica_log.read_text():
        assert time.monotonic() < deadline, f"the replica did not log request_id {answered}"
        time.sleep(0.1)
