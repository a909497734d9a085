"""Prometheus metrics. With several workers, ``python -m service`` sets PROMETHEUS_MULTIPROC_DIR
before any worker starts, and /metrics then adds up every worker's numbers."""

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

REQUESTS = Counter("attention_requests", "HTTP requests answered", ["method", "endpoint", "status"])
LATENCY = Histogram(
    "attention_request_duration_seconds",
    "Time from the request's start to the end of its response",
    ["method", "endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
_SIZES = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
REQUEST_BYTES = Histogram(
    "attention_request_size_bytes", "Request body sizes", ["endpoint"], buckets=_SIZES
)
RESPONSE_BYTES = Histogram(
    "attention_response_size_bytes", "Response body sizes", ["endpoint"], buckets=_SIZES
)


_Children = tuple[Counter, Histogram, Histogram, Histogram]
_children: dict[tuple[str, str, int], _Children] = {}  # labels looked up once per combination
_MAX_CHILDREN = 1024  # methods and endpoints are few (unmatched paths share one label)


def observe(
    method: str, endpoint: str, status: int, seconds: float, bytes_in: int, bytes_out: int
) -> None:
    """Record one answered request."""
    key = (method, endpoint, status)
    children = _children.get(key)
    if children is None:
        children = (
            REQUESTS.labels(method, endpoint, str(status)),
            LATENCY.labels(method, endpoint),
            REQUEST_BYTES.labels(endpoint),
            RESPONSE_BYTES.labels(endpoint),
        )
        if len(_children) < _MAX_CHILDREN:
            _children[key] = children
    requests, latency, request_bytes, response_bytes = children
    requests.inc()
    latency.observe(seconds)
    request_bytes.observe(bytes_in)
    response_bytes.observe(bytes_out)


def render() -> tuple[bytes, str]:
    """The exposition text of every worker (or of this process when there is one)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


# admission by cost (service.http.budget); gauges are summed over the live workers
ADMITTED = Counter("attention_admitted", "Requests admitted to compute")
QUEUED = Counter("attention_queued", "Requests that had to wait for memory")
REJECTED = Counter("attention_rejected", "Requests refused with 503", ["reason"])
WAITING = Gauge("attention_waiting", "Requests waiting for memory now", multiprocess_mode="livesum")
BUDGET = Gauge(
    "attention_budget_bytes",
    "Memory budget for admitted requests, summed over the live workers (each worker admits "
    "against its own share: this total divided by the number of workers)",
    multiprocess_mode="livesum",
)
BUDGET_IN_USE = Gauge(
    "attention_budget_in_use_bytes",
    "Memory held by admitted requests, summed over the live workers",
    multiprocess_mode="livesum",
)
QUEUE_WAIT = Histogram(
    "attention_queue_wait_seconds",
    "Time a request waited for memory",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
