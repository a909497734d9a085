"""The service's app run inside this Python process: ``Client.local()``, no server.

The app is an ASGI application (``service.http.app.create_app``, what ``service.main:app`` is
built by). Requests reach it through httpx's ``ASGITransport``, so they pass through the same
middleware, parsing, limits and errors as over HTTP. Only the socket is missing, and with it
what guards a connection (service.http.connection: head size, deadlines, open connections),
which has nothing to guard here, and the parser processes: large bodies are parsed in a thread
of this process (service.http.parser.InThread), so that no process re-runs the caller's script.
Its lifespan (the readiness warm-up at start, the shutdown at the end) is run by hand: an
ASGI ``lifespan`` task started before the first request and told to stop on ``close()``.

``AsyncClient.local()`` runs the app on the caller's asyncio loop. ``Client.local()`` runs it
on a loop of its own in a daemon thread, so that it also works where a loop is already running
in the calling thread (a Jupyter kernel's): each request waits there for its answer.
"""

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]

LOCAL_URL = "http://localhost"
NOT_INSTALLED = (
    "Client.local() runs the attention service inside this Python process, but the service "
    "cannot be imported here ({error}). Install it into this environment from a clone of the "
    "repository: `pip install -e .` in the repository's root (in a notebook: "
    "`%pip install -e /path/to/the/repository`), then restart the kernel; or start a server "
    '(`make run`) and use Client("http://127.0.0.1:8000") instead.'
)


def service_app() -> ASGIApp:
    """A new app of the attention service, with the environment's ``ATTENTION_*`` settings as a
    server would read them, but logging only warnings (no access line for every request).

    Large bodies are parsed in a thread of this process rather than in a parser process
    (service.http.parser.InThread): a process started by ``spawn`` would re-run the caller's
    script, which need not guard itself with ``if __name__ == "__main__":``."""
    try:
        from service.config import Settings
        from service.http.app import create_app
        from service.http.parser import InThread
    except ImportError as err:
        raise ImportError(NOT_INSTALLED.format(error=err)) from err
    settings = Settings(log_level="warning")
    app = create_app(settings)
    app.state.parser = InThread(settings.parse_concurrency)
    local: ASGIApp = app
    return local


class StartupFailed(RuntimeError):
    """The app's lifespan startup failed (or the app ended before it was done)."""


class Lifespan:
    """The ASGI lifespan protocol, driven by hand on the running asyncio loop."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}  # what the app's lifespan stores for its requests
        self._task: asyncio.Task[None] | None = None
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        await self.app(scope, self._to_app.get, self._from_app.put)

    async def startup(self) -> None:
        """Send ``lifespan.startup`` and wait until the app has started."""
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            await self._ask("lifespan.startup")
        except StartupFailed:
            with contextlib.suppress(Exception):
                await self._task  # its exception is the one StartupFailed reports
            raise

    async def shutdown(self) -> None:
        """Send ``lifespan.shutdown``, wait for it to complete and for the app's task to end."""
        if self._task is None or self._task.done():
            return
        try:
            await self._ask("lifespan.shutdown")
        finally:
            with contextlib.suppress(Exception):
                await self._task

    async def _ask(self, phase: str) -> None:
        """Send ``phase`` and wait for the app's ``<phase>.complete`` (raise on ``.failed``)."""
        assert self._task is not None
        await self._to_app.put({"type": phase})
        answer = asyncio.ensure_future(self._from_app.get())
        await asyncio.wait({answer, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            message = answer.result()
        else:  # the app's lifespan ended without answering: its exception says why
            answer.cancel()
            error = self._task.exception()
            raise StartupFailed(f"the service's app ended during {phase}: {error!r}") from error
        if message["type"] != f"{phase}.complete":
            raise StartupFailed(f"{phase} failed: {message.get('message', '')}".strip())


class LocalApp:
    """One app in process: its lifespan, started once, and its requests (httpx.ASGITransport).

    An app that raises is answered 500, as a server would (not raised into the caller)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._lifespan: Lifespan | None = None
        self._lock: asyncio.Lock | None = None
        self._transport = httpx.ASGITransport(app=self._with_state, raise_app_exceptions=False)

    async def _with_state(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        """The app, each request given a copy of the lifespan's state (as servers do)."""
        if scope["type"] == "http" and self._lifespan is not None:
            scope["state"] = dict(self._lifespan.state)
        await self.app(scope, receive, send)

    async def start(self) -> None:
        """Run the app's startup, once (concurrent first requests wait for the same one)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._lifespan is None:
                lifespan = Lifespan(self.app)
                await lifespan.startup()
                self._lifespan = lifespan

    async def stop(self) -> None:
        """Run the app's shutdown, if it started."""
        lifespan, self._lifespan = self._lifespan, None
        if lifespan is not None:
            await lifespan.shutdown()

    async def send(self, request: httpx.Request) -> httpx.Response:
        """One request, after the startup; the answer's body read in full."""
        await self.start()
        response = await self._transport.handle_async_request(request)
        body = b"".join([part async for part in response.aiter_raw()])
        return httpx.Response(
            response.status_code, headers=response.headers.raw, stream=httpx.ByteStream(body)
        )


class AsyncLocalTransport(httpx.AsyncBaseTransport):
    """``AsyncClient.local()``'s transport: the app on the caller's asyncio loop, started by the
    first request and shut down by ``aclose()``."""

    def __init__(self, app: ASGIApp) -> None:
        self.local = LocalApp(app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.local.send(request)

    async def aclose(self) -> None:
        await self.local.stop()


class LoopThread:
    """An asyncio loop running in a daemon thread; coroutines run there from any other thread
    (a daemon, so that a client nobody closed never keeps the interpreter from exiting)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="attention-service-local", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (interrupted: cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop and its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _shut(local: LocalApp, thread: LoopThread) -> None:
    """Shut the app down and stop its loop (``close()``, garbage collection, interpreter exit)."""
    if thread.loop.is_closed():
        return
    try:
        thread.run(local.stop())
    finally:
        thread.stop()


class SyncLocalTransport(httpx.BaseTransport):
    """``Client.local()``'s transport: the app on a loop in its own thread, started at once
    (a failing startup raises here) and shut down by ``close()``, by garbage collection, or at
    the interpreter's exit."""

    def __init__(self, app: ASGIApp) -> None:
        self.local = LocalApp(app)
        self._thread = LoopThread()
        self._shut = weakref.finalize(self, _shut, self.local, self._thread)
        try:
            self._thread.run(self.local.start())
        except BaseException:
            self._shut()
            raise

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        copy = httpx.Request(
            request.method,
            request.url,
            headers=request.headers,
            content=request.read(),
            extensions=request.extensions,
        )
        return self._thread.run(self.local.send(copy))

    def close(self) -> None:
        self._shut()
