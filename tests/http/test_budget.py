"""Admission by cost (service.http.budget): who is admitted, who waits, who gets 503 or 413, and
where the budget comes from."""

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app
from service.http.budget import Budget, Overloaded, memory_limit_bytes, worker_budget
from service.wire.errors import LimitError
from service.wire.media import MEDIA_TYPE as MEDIA

MB = 1 << 20


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_admits_while_the_sum_fits_and_release_gives_back() -> None:
    async def scenario() -> None:
        budget = Budget(100, queue_length=4, max_wait=1.0)
        first = await budget.admit(60)
        second = await budget.admit(40)
        assert budget.in_use == 100
        first()
        first()  # a second call gives nothing back twice
        assert budget.in_use == 40
        second()
        assert budget.in_use == 0

    run(scenario)


def test_a_request_larger_than_the_whole_budget_is_413_at_once() -> None:
    async def scenario() -> None:
        with pytest.raises(LimitError) as err:
            await Budget(10 * MB, 4, 1.0).admit(11 * MB)
        assert err.value.status == 413 and err.value.limit == 10 * MB
        assert "11 MiB" in str(err.value) and "budget of 10 MiB" in str(err.value)

    run(scenario)


def test_a_waiter_is_admitted_when_memory_comes_free() -> None:
    async def scenario() -> None:
        budget = Budget(100, 4, max_wait=5.0)
        held = await budget.admit(80)
        waiter = asyncio.create_task(budget.admit(50))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        held()
        release = await asyncio.wait_for(waiter, 1.0)
        assert budget.in_use == 50
        release()

    run(scenario)


def test_small_requests_pass_a_large_one_that_waits() -> None:
    async def scenario() -> None:
        budget = Budget(100, 4, max_wait=5.0)
        held = await budget.admit(60)
        large = asyncio.create_task(budget.admit(90))
        await asyncio.sleep(0.01)
        small = await asyncio.wait_for(budget.admit(30), 0.5)  # fits now: not behind `large`
        assert budget.in_use == 90 and not large.done()
        small()
        held()
        (await asyncio.wait_for(large, 1.0))()
        assert budget.in_use == 0

    run(scenario)


def test_a_full_queue_and_a_wait_that_runs_out_are_503_with_retry_after() -> None:
    async def scenario() -> None:
        budget = Budget(100, queue_length=1, max_wait=0.2)
        held = await budget.admit(100)
        waiting = asyncio.create_task(budget.admit(10))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as full:
            await budget.admit(10)
        assert full.value.status == 503 and full.value.headers["Retry-After"] == "2"
        assert "the queue for memory is full (1 waiting)" in str(full.value)
        with pytest.raises(Overloaded) as late:
            await waiting
        assert "within 0.2 s" in str(late.value)
        assert (full.value.reason, late.value.reason) == ("queue_full", "wait_timeout")
        assert budget.in_use == 100 and not budget._waiting
        held()

    run(scenario)


def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    async def scenario() -> None:
        budget = Budget(100, 4, max_wait=5.0)
        held = await budget.admit(100)
        waiter = asyncio.create_task(budget.admit(10))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        held()
        assert budget.in_use == 0 and not budget._waiting

    run(scenario)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.max": "4294967296\n"}, 4 << 30),
        ({"memory.max": "max\n", "memory/memory.limit_in_bytes": "2147483648\n"}, 2 << 30),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1: no limit
        ({}, None),
    ],
    ids=["cgroup-v2", "cgroup-v1", "v1-unlimited", "no-cgroup"],
)
def test_memory_limit_from_cgroups_else_physical_memory(
    tmp_path: Path, files: dict[str, str], expected: int | None
) -> None:
    import os

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_limit_bytes(tmp_path) == (physical if expected is None else expected)


def test_worker_budget_shares_the_limit_less_headroom() -> None:
    settings = Settings(workers=2, max_body_bytes=32 * MB, parse_concurrency=1)
    # 4 GiB ÷ 2 workers − 256 MiB for the worker − 256 MiB + 10 × 32 MiB for its parser process
    assert worker_budget(settings, limit=4 << 30) == (2048 - 256 - 256 - 320) * MB
    assert worker_budget(Settings(memory_budget_bytes=123 * MB)) == 123 * MB
    assert worker_budget(settings, limit=256 * MB) == 64 * MB  # never below the floor


def test_over_the_budget_is_413_through_the_api() -> None:
    with TestClient(create_app(Settings(memory_budget_bytes=8 * MB))) as client:
        r = client.post("/attention", json={"seed": 0, "seq_len": 400, "d_model": 4, "d_k": 4})
        assert r.status_code == 413, r.text
        assert "budget of 8 MiB" in r.json()["message"]
        assert r.json()["errors"][0]["limit"] == 8 * MB
        small = client.post("/attention", json={"seed": 0, "seq_len": 3, "d_model": 4, "d_k": 4})
        assert small.status_code == 200  # small requests are never queued or refused for memory


def test_mask_lists_are_capped_and_their_work_is_counted(client: TestClient) -> None:
    """Both are refused before any mask is built (the rules run before computing)."""
    base = {"seed": 0, "seq_len": 2048, "d_model": 1, "d_k": 1, "include": ["output"]}
    many = client.post("/mask", json={**base, "mask": [{"type": "causal"}] * 2000})
    assert many.status_code == 422 and many.json()["errors"][0]["field"] == "mask"
    assert "at most 64" in many.json()["message"]
    work = client.post("/mask", json={**base, "mask": [{"type": "causal"}] * 20})
    assert work.status_code == 413 and "fewer masks" in work.json()["message"]


def test_per_head_weight_lists_are_capped_before_conversion(client: TestClient) -> None:
    head = {"w_q": [[1.0]], "w_k": [[1.0]], "w_v": [[1.0]]}
    r = client.post("/multihead", json={"x": [[1.0]], "num_heads": 2000, "heads": [head] * 2000})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "heads"
    assert "at most 1024" in r.json()["message"]


def test_a_503_carries_retry_after_and_its_reason_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    app = create_app(Settings(memory_budget_bytes=64 * MB, queue_length=0))
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger="service.access"):
        app.state.budget.in_use = 64 * MB  # every byte taken by requests in flight
        r = client.post("/attention", json={"seed": 0, "seq_len": 200, "d_model": 4, "d_k": 4})
        app.state.budget.in_use = 0
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.json()["errors"][0]["type"] == "overloaded"
    line: Any = next(rec for rec in caplog.records if rec.name == "service.access")
    assert (line.status, line.reason) == (503, "queue_full")


def test_a_ticket_gives_back_in_parts_and_admits_waiters_as_it_does() -> None:
    async def scenario() -> None:
        budget = Budget(100, 4, max_wait=5.0)
        ticket = await budget.admit(90)
        waiter = asyncio.create_task(budget.admit(50))
        await asyncio.sleep(0.01)
        ticket.give_back(30)  # 60 held: 50 more does not fit yet
        await asyncio.sleep(0.01)
        assert budget.in_use == 60 and not waiter.done()
        ticket.give_back(30)
        other = await asyncio.wait_for(waiter, 1.0)
        assert budget.in_use == 80 and ticket.held == 30
        ticket()
        ticket()
        ticket.give_back(10)  # nothing left to give
        other()
        assert budget.in_use == 0

    run(scenario)


def _numbers(seq_len: int) -> int:
    """The numbers /attention computes for seed, seq_len, d_model = d_k = 4: x, q, k, v, the
    three weights, scores, scaled scores and weights (L² each), and the output."""
    return 4 * seq_len * 4 + 3 * 16 + 3 * seq_len**2 + seq_len * 4


@pytest.mark.parametrize(
    ("seq_len", "tier"),
    [(3, "inline"), (100, "whole"), (600, "streamed")],
    ids=["inline", "whole", "streamed"],
)
def test_every_answer_tier_gives_the_same_numbers_and_its_memory_back(
    seq_len: int, tier: str
) -> None:
    """Small answers are made on the event loop, medium ones in one thread hop and sent in one
    piece (with their length), large ones streamed: each JSON answer is softmax(Q Kᵀ/√d_k) of
    its own Q and K, equals the safetensors answer, and leaves the budget as it found it."""
    import numpy as np
    from safetensors.numpy import load

    from service.http.routes import INLINE_NUMBERS, WHOLE_NUMBERS

    body = {"seed": 1, "seq_len": seq_len, "d_model": 4, "d_k": 4}
    numbers = _numbers(seq_len)
    assert {"inline": numbers <= INLINE_NUMBERS, "whole": INLINE_NUMBERS < numbers <= WHOLE_NUMBERS,
            "streamed": numbers > WHOLE_NUMBERS}[tier]  # fmt: skip
    app = create_app(Settings(log_level="warning"))
    with TestClient(app) as client:
        r = client.post("/attention", json=body)
        assert r.status_code == 200 and app.state.budget.in_use == 0
        binary = client.post("/attention", json=body, headers={"Accept": MEDIA})
        assert binary.status_code == 200 and app.state.budget.in_use == 0
    streamed = tier == "streamed"
    assert ("content-length" in r.headers) is not streamed  # streamed JSON: chunked
    answer = {k: np.asarray(v) for k, v in r.json().items() if k in ("q", "k", "weights")}
    logits = answer["q"] @ answer["k"].T / 2.0
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(answer["weights"], expected / expected.sum(axis=1, keepdims=True),
                               rtol=0, atol=1e-12)  # fmt: skip
    tensors = load(binary.content)
    for name in ("q", "k", "weights"):
        np.testing.assert_array_equal(tensors[name], answer[name])


def test_an_answer_whose_encoded_bytes_would_not_fit_the_budget_streams_instead() -> None:
    """A budget smaller than a medium answer's cost with its encoded bytes, but not than its
    cost alone: the answer streams (chunked JSON) rather than being refused with 413."""
    from service.http.budget import cost_bytes, whole_cost_bytes

    seq_len = 100
    numbers = _numbers(seq_len)
    budget = (cost_bytes(numbers) + whole_cost_bytes(numbers)) // 2
    app = create_app(Settings(log_level="warning", memory_budget_bytes=budget))
    with TestClient(app) as client:
        r = client.post("/attention", json={"seed": 1, "seq_len": seq_len, "d_model": 4, "d_k": 4})
        assert r.status_code == 200 and app.state.budget.in_use == 0
    assert "content-length" not in r.headers and len(r.json()["weights"]) == seq_len


def test_the_trim_after_a_large_answer_waits_for_no_request_to_hold_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Free pages go back only once no admitted request holds memory (a trim while one
    computes would stall it), once however many large answers asked for it meanwhile."""
    import service.http.budget as budget_module

    trims: list[float] = []
    monkeypatch.setattr(budget_module, "release_memory", lambda: trims.append(time.monotonic()))
    monkeypatch.setattr(budget_module, "TRIM_IDLE_SECONDS", 0.02)

    async def scenario() -> None:
        budget = Budget(100, 4, max_wait=5.0)
        ticket = await budget.admit(60)  # a request computing
        await budget.trim_when_idle()
        await budget.trim_when_idle()  # a second large answer meanwhile: one trim
        await asyncio.sleep(0.1)
        assert trims == []  # still held: the trim waits
        ticket()
        await asyncio.sleep(0.1)
        assert len(trims) == 1

    run(scenario)
