"""Large bodies (over service.http.routes.THREAD_BODY_BYTES) are parsed in a separate process,
so that parsing never stalls a worker.

Parsing a large JSON body (orjson) and turning its lists into arrays hold the GIL for a long time
in C code (≈0.5 s for 28 MiB): in the worker's own process that would stop its event loop, and
with it every probe and small request it serves. A safetensors body is no different: its
header (up to MAX_TENSORS entries) and the JSON under ``__metadata__["json"]`` (as large as a
JSON body) are parsed and checked here too. One parser process per worker does it instead
(``parse_concurrency`` of them); the worker waits for the answer without holding the GIL, and
gets back what the endpoint's door admits there (service.http.doors.checked: a compute
endpoint's service.trace.Admitted, whose arrays pickle as plain copies, or /model's request).

In process (``Client.local()``, attention_client.local) there is no worker to keep responsive and
no script of ours to start: a ``spawn``ed process re-runs the caller's ``__main__`` (the
multiprocessing guide's "safe importing of the main module"), so a plain script without an
``if __name__ == "__main__":`` guard would start itself again. There, :class:`InThread` parses in
a thread instead, with the same checks and errors.
"""

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from service.config import Settings
from service.http.budget import Overloaded
from service.http.doors import checked
from service.memory import release_memory, tune_allocator
from service.wire.errors import ErrorItem, RequestError
from service.wire.media import Format


class Parser:
    """A small pool of parser processes, started on first use (``spawn``: no copy of the
    worker's threads or sockets)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._slots = asyncio.Semaphore(processes)  # one body per process; the rest wait here

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.processes, mp_context=context, initializer=_start, initargs=(os.getpid(),)
            )
        return self._pool

    async def check(
        self, raw: bytes, endpoint: str, settings: Settings, form: Format = "json"
    ) -> Any:
        """Parse ``raw`` (as JSON or safetensors: ``form``) and admit it for ``endpoint`` in a
        parser process (service.http.doors.checked); raise the same errors as in process."""
        loop = asyncio.get_running_loop()
        try:
            async with self._slots:  # a client that leaves while waiting never reaches the pool
                outcome = await loop.run_in_executor(
                    self._executor(), _check, raw, endpoint, settings, form
                )
        except BrokenProcessPool:  # a parser died (e.g. killed for memory): start afresh
            self.close()
            raise Overloaded(
                "parser_restarted", "the service's parser restarted while reading this body"
            ) from None
        if outcome[0] == "error":
            _, status, items = outcome
            error = RequestError([ErrorItem(**item) for item in items])
            error.status = status
            raise error
        return outcome[1]

    def close(self, wait: bool = False) -> None:
        """Stop the parser processes (they start again on the next large body); ``wait`` for
        them to exit (at shutdown: a worker process may end without running exit handlers)."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None


class InThread:
    """:class:`Parser`'s stand-in for the service run in the caller's own process: the same
    checks in a thread of this process (one body at a time), no process started."""

    def __init__(self, concurrency: int = 1) -> None:
        self._slots = asyncio.Semaphore(concurrency)

    async def check(
        self, raw: bytes, endpoint: str, settings: Settings, form: Format = "json"
    ) -> Any:
        """Parse ``raw`` and admit it for ``endpoint`` (service.http.doors.checked)."""
        async with self._slots:
            try:
                return await asyncio.to_thread(checked, raw, endpoint, settings, form)
            finally:
                release_memory()

    def close(self, wait: bool = False) -> None:
        """Nothing to stop (the same signature as :meth:`Parser.close`)."""


def _start(parent: int) -> None:
    """In a new parser process: cap the allocator's arenas, and end with the worker that
    started it, however that one ends (even SIGKILL: nobody would read our answers)."""
    tune_allocator()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _check(raw: bytes, endpoint: str, settings: Settings, form: Format) -> tuple[Any, ...]:
    """In the parser process: the endpoint's checks, as a plain tuple (errors included)."""
    try:
        admitted = checked(raw, endpoint, settings, form)
    except RequestError as err:
        return ("error", err.status, [item.model_dump() for item in err.items])
    finally:
        release_memory()  # the parsed lists are gone: give their pages back
    return ("ok", admitted)
