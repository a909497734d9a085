"""Admission by cost: each worker runs requests while the memory they may use fits its budget.

A request's cost is known before it computes (the numbers it makes, every intermediate
included: :func:`cost_bytes`). A request that fits is admitted at once, even when larger ones
wait, so small requests never queue behind large ones. One that does not fit waits in a bounded
queue; when the queue is full or its wait runs out it gets 503 with ``Retry-After``. A request
larger than the whole budget gets 413 at once. An admitted request's :class:`Ticket` gives its
memory back in parts as its answer streams out. The budget comes from the container's memory
limit (cgroup v2, then v1, else physical memory), shared among the workers, less headroom for
the interpreters (the worker's and its parser processes') and for the bodies they parse
(:func:`worker_budget`).
"""

import asyncio
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from service.config import Settings
from service.http import metrics
from service.memory import release_memory
from service.wire.errors import ErrorItem, LimitError, RequestError

BYTES_PER_NUMBER = 16  # a float64 and its share of copies and buffers (measured: README)
BASE_COST = 1 << 20  # buffers every request holds while it is answered
JSON_BYTES_PER_NUMBER = 25  # "-1.2345678901234567e-100," at most
INTERPRETER_BYTES = 256 << 20  # a worker's own RSS: Python, NumPy, FastAPI
PARSE_BYTES_PER_BODY_BYTE = 10  # JSON lists of Python floats, while a body parses
MIN_BUDGET = 64 << 20
RETRY_AFTER_SECONDS = 2
TRIM_IDLE_SECONDS = (
    0.25  # no admitted request this long: free pages go back (Budget.trim_when_idle)
)
UNLIMITED = 1 << 60  # cgroup v1 writes a huge number for "no limit"


def cost_bytes(computed_numbers: int) -> int:
    """The memory a request may hold while it is computed and answered."""
    return BASE_COST + BYTES_PER_NUMBER * computed_numbers


def whole_cost_bytes(computed_numbers: int) -> int:
    """The memory a request answered in one piece may hold: its cost, and its encoded answer
    (it returns at most the numbers it computes; as JSON, a float64's shortest form and its
    comma take at most JSON_BYTES_PER_NUMBER)."""
    return cost_bytes(computed_numbers) + JSON_BYTES_PER_NUMBER * computed_numbers


def held_bytes(numbers: int) -> int:
    """The memory ``numbers`` still waiting to be written hold (of a request's cost)."""
    return BYTES_PER_NUMBER * numbers


def memory_limit_bytes(root: Path = Path("/sys/fs/cgroup")) -> int:
    """The container's memory limit: cgroup v2 ``memory.max``, else v1
    ``memory/memory.limit_in_bytes``, else the machine's physical memory."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED:
            return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def worker_budget(settings: Settings, limit: int | None = None) -> int:
    """Bytes of admitted work one worker may hold: the setting when given, else its share of
    the memory limit less the interpreter and the bodies it may be parsing."""
    if settings.memory_budget_bytes is not None:
        return settings.memory_budget_bytes
    share = (memory_limit_bytes() if limit is None else limit) // settings.workers
    parsers = settings.parse_concurrency  # processes (service.http.parser), each parsing a body
    parsing = parsers * (INTERPRETER_BYTES + PARSE_BYTES_PER_BODY_BYTE * settings.max_body_bytes)
    return max(MIN_BUDGET, share - INTERPRETER_BYTES - parsing)


class Overloaded(RequestError):
    """The worker's budget is taken and the request could not wait: 503 with Retry-After."""

    status = 503

    def __init__(self, reason: str, message: str) -> None:
        super().__init__([ErrorItem(field=None, message=message, type="overloaded")])
        self.headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        self.reason = reason  # queue_full, wait_timeout, parser_restarted: metrics and access log
        metrics.REJECTED.labels(reason).inc()


@dataclass
class Budget:
    """One worker's budget (event-loop state: used from the event loop only)."""

    total: int
    queue_length: int
    max_wait: float
    in_use: int = 0
    _waiting: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    _trim: asyncio.TimerHandle | None = None

    async def trim_when_idle(self) -> None:
        """Give the allocator's free pages back to the system (after a large answer):
        TRIM_IDLE_SECONDS later, or once no admitted request holds memory after that. glibc's
        trim holds the heap's lock while it returns hundreds of megabytes, and a request
        computing meanwhile would wait on its allocations, then fault the pages in again."""
        self._schedule_trim(asyncio.get_running_loop())

    def _schedule_trim(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._trim is None:
            self._trim = loop.call_later(TRIM_IDLE_SECONDS, self._trim_if_idle, loop)

    def _trim_if_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        self._trim = None
        if self.in_use > 0:
            self._schedule_trim(loop)  # later
        else:
            loop.run_in_executor(None, release_memory)

    async def admit(self, cost: int, advice: str = "make the request smaller") -> "Ticket":
        """Wait until ``cost`` fits, then return the ticket that gives it back. Raises
        LimitError (413, with ``advice``: what the caller can change) when it can never fit,
        Overloaded (503) when it cannot wait."""
        if cost > self.total:
            raise LimitError(
                None,
                f"this request needs about {_mb(cost)} of memory, more than this worker's whole "
                f"budget of {_mb(self.total)}; {advice}",
                self.total,
            )
        if self.in_use + cost > self.total:
            await self._wait(cost)
        else:
            self._take(cost)
        metrics.ADMITTED.inc()
        return Ticket(self, cost)

    def give(self, n: int) -> None:
        """``n`` admitted bytes come back: admit whoever now fits."""
        self.in_use -= n
        metrics.BUDGET_IN_USE.dec(n)
        self._wake()

    async def _wait(self, cost: int) -> None:
        if len(self._waiting) >= self.queue_length:
            raise Overloaded(
                "queue_full",
                f"the service is busy: the queue for memory is full ({len(self._waiting)} "
                f"waiting); retry in {RETRY_AFTER_SECONDS} s",
            )
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (cost, ticket)
        self._waiting.append(entry)
        metrics.QUEUED.inc()
        metrics.WAITING.inc()
        start = asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(asyncio.shield(ticket), self.max_wait)
        except TimeoutError:
            if ticket.done():  # admitted just as the wait ran out: keep it
                return
            raise Overloaded(
                "wait_timeout",
                f"the service is busy: no memory came free within {self.max_wait:g} s; "
                f"retry in {RETRY_AFTER_SECONDS} s",
            ) from None
        except BaseException:
            if ticket.done() and not ticket.cancelled():  # admitted, then abandoned: give back
                self.give(cost)
            raise
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)
            metrics.WAITING.dec()
            metrics.QUEUE_WAIT.observe(asyncio.get_running_loop().time() - start)

    def _take(self, cost: int) -> None:
        self.in_use += cost
        metrics.BUDGET_IN_USE.inc(cost)

    def _wake(self) -> None:
        """Admit waiting requests that now fit, oldest first; a large one does not block a
        smaller one behind it that fits."""
        for cost, ticket in list(self._waiting):
            if ticket.done():
                continue
            if self.in_use + cost <= self.total:
                self._take(cost)
                ticket.set_result(None)
                self._waiting.remove((cost, ticket))


class Ticket:
    """The memory admitted to one request: given back in parts while its answer streams out
    (:meth:`give_back`), the rest when it ends (call the ticket). Event-loop thread only."""

    def __init__(self, budget: Budget, cost: int) -> None:
        self.budget = budget
        self.held = cost

    def give_back(self, n: int) -> None:
        """Give back ``n`` bytes (at most what is still held)."""
        n = min(n, self.held)
        if n > 0:
            self.held -= n
            self.budget.give(n)

    def __call__(self) -> None:
        """Give back everything still held (again: nothing)."""
        self.give_back(self.held)


def _mb(n: int) -> str:
    return f"{math.ceil(n / 2**20):,} MiB"
