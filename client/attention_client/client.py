"""``Client`` (sync) and ``AsyncClient``: the HTTP side, retries included."""

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from attention_client.arrays import normalise
from attention_client.endpoints import _Endpoints
from attention_client.errors import ServiceError, error_from, retry_after
from attention_client.local import (
    LOCAL_URL,
    ASGIApp,
    AsyncLocalTransport,
    SyncLocalTransport,
    service_app,
)
from attention_client.result import Result
from attention_client.wire import JSON, SAFETENSORS, decode, encode

MAX_WAIT = 30.0  # seconds: the longest wait asked for, whatever Retry-After says (before jitter)
MIN_WAIT = 0.1  # seconds: the shortest wait, even when Retry-After says 0
JITTER = 0.5  # each wait is drawn from [w, w·(1 + JITTER)): clients refused together spread out
DEFAULT_TIMEOUT = httpx.Timeout(120.0, connect=10.0)  # each connect, read and write
DEFAULT_DEADLINE = 600.0  # seconds: one try in all, when timeout is not a number
# Sent again: no byte of the request was sent, or the server closed the connection without an
# answer (a kept-alive connection whose idle timeout raced the request). Every request of this
# service is a pure computation, so sending it again is safe.
RETRIED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)


def _wait(
    attempt: int, max_retries: int, response: httpx.Response | None, draw: Callable[[], float]
) -> float | None:
    """Seconds to wait before trying again, or None to stop: retried are a 503 (after its
    ``Retry-After``) and a connection that failed before any answer, with a doubling backoff.

    The wait asked for (at most ``MAX_WAIT``, at least ``MIN_WAIT``) is a floor, never
    shortened; up to ``JITTER`` of it is added at random (``draw()`` in [0, 1)), so that clients
    refused at the same moment do not all come back at the same moment."""
    if attempt >= max_retries or (response is not None and response.status_code != 503):
        return None
    asked = None if response is None else retry_after(response)
    floor = max(MIN_WAIT, min(MAX_WAIT, asked if asked is not None else 0.5 * 2**attempt))
    return floor * (1.0 + JITTER * draw())


def _headers(
    api_key: str | None, binary: bool, headers: Mapping[str, str] | None
) -> dict[str, str]:
    """The headers every request carries: the key, and the answer's format."""
    out = {"Accept": SAFETENSORS if binary else JSON}
    if api_key is not None:
        out["Authorization"] = f"Bearer {api_key}"
    out.update(headers or {})
    return out


def _checked(response: httpx.Response) -> httpx.Response:
    """The answer, when it is the service's own success; else its error raised: the service's
    errors as theirs, and a redirect or an answer that is neither JSON nor safetensors as a
    ServiceError saying that base_url is probably not the service's."""
    if response.status_code >= 400:
        raise error_from(response)
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if response.is_redirect or media not in (JSON, SAFETENSORS):
        where = response.headers.get("location")
        what = f"a redirect to {where}" if response.is_redirect else f"{media or 'no type'}"
        raise ServiceError(
            response.status_code,
            f"{response.request.url} answered {what}, not the service's JSON or safetensors: "
            "is base_url the service's address (e.g. http://127.0.0.1:8000, no path)?",
            request_id=response.headers.get("x-request-id"),
        )
    return response


def _result(response: httpx.Response) -> Result:
    """A compute answer as a Result, or its error raised."""
    arrays, rest = decode(_checked(response))
    return Result(arrays, rest, response.headers.get("x-request-id"))


def _json(response: httpx.Response) -> Any:
    """An operations answer's JSON, or its error raised."""
    return _checked(response).json()


def _deadline(timeout: float | httpx.Timeout) -> float:
    """The longest one try may take, from sending to the answer's last byte: a number given as
    ``timeout`` means that much in all (httpx's own timeouts bound each read, and a server that
    trickles its answer a byte at a time would pass them), else DEFAULT_DEADLINE."""
    return float(timeout) if isinstance(timeout, int | float) else DEFAULT_DEADLINE


def _late(request: httpx.Request, deadline: float) -> httpx.ReadTimeout:
    return httpx.ReadTimeout(
        f"the answer took longer than {deadline:g} s in all (the timeout)", request=request
    )


def _whole(response: httpx.Response, body: bytes) -> httpx.Response:
    """A streamed response with its raw body read, as an ordinary response."""
    return httpx.Response(
        response.status_code, headers=response.headers, content=body, request=response.request
    )


class _Common:
    """Settings both clients share."""

    def __init__(self, max_retries: int, binary: bool, jitter: Callable[[], float]) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be ≥ 0")
        self.max_retries = max_retries
        self.binary = binary
        self._jitter = jitter

    def _retry_wait(
        self, attempt: int, response: httpx.Response | None, retry_503: bool
    ) -> float | None:
        """``_wait`` with this client's settings (a 503 retried only when ``retry_503``)."""
        tries = self.max_retries if retry_503 or response is None else 0
        return _wait(attempt, tries, response, self._jitter)

    def _body(self, fields: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        """A request's body and its Content-Type header."""
        content, media = encode(normalise(fields), self.binary)
        return content, {"Content-Type": media}


class Client(_Common, _Endpoints[Result]):
    """A synchronous client of the attention service.

    ``Client("http://127.0.0.1:8000", api_key=None)``; use it as a context manager or call
    :meth:`close`. ``binary=True`` (default) sends and receives safetensors, ``False`` JSON:
    the results are the same. A 503 is retried up to ``max_retries`` times after the wait the
    service asks for (at most 30 s, plus up to half that again at random: ``jitter`` draws the
    fraction, default ``random.random``), and so is a connection that fails before any answer;
    other errors raise at once. ``transport`` is handed to ``httpx.Client`` (tests use
    ``httpx.MockTransport``); ``sleep`` replaces ``time.sleep`` between tries.

    :meth:`local` runs the service inside this process instead, with no server.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        binary: bool = True,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(max_retries, binary, jitter)
        self._sleep = sleep
        self._deadline = _deadline(timeout)
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            headers=_headers(api_key, binary, headers),
        )

    @classmethod
    def local(
        cls,
        api_key: str | None = None,
        *,
        app: ASGIApp | None = None,
        max_retries: int = 3,
        binary: bool = True,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> Self:
        """A client of the service run inside this process: no server, no port, the same
        methods, results (bit for bit) and errors as over HTTP.

        Needs the service importable here (``pip install -e .`` in the repository; otherwise
        an ImportError says so). Its settings are the environment's ``ATTENTION_*`` variables,
        as a server's, with logging at warning level; ``app`` runs another ASGI app instead
        (e.g. ``create_app(Settings(...))``). The app starts now (its readiness warm-up) on an
        event loop of its own in a background thread, which is why this works inside Jupyter,
        where a loop already runs; :meth:`close` (or the ``with`` block) shuts it down.
        """
        transport = SyncLocalTransport(app if app is not None else service_app())
        return cls(
            LOCAL_URL,
            api_key,
            max_retries=max_retries,
            binary=binary,
            transport=transport,
            headers=headers,
            sleep=sleep,
            jitter=jitter,
        )

    def _send(self, method: str, path: str, *, retry_503: bool = True, **kw: Any) -> httpx.Response:
        """One request, tried again as ``_wait`` says."""
        attempt = 0
        while True:
            try:
                response = self._within_deadline(self._http.build_request(method, path, **kw))
            except RETRIED:
                wait = self._retry_wait(attempt, None, retry_503)
                if wait is None:
                    raise
            else:
                wait = self._retry_wait(attempt, response, retry_503)
                if wait is None:
                    return response
            self._sleep(wait)
            attempt += 1

    def _within_deadline(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and read its answer, within the deadline of one try."""
        end = time.monotonic() + self._deadline
        response = self._http.send(request, stream=True)
        if response.is_stream_consumed:  # answered whole (a mock or in-process transport)
            return response
        try:
            chunks = []
            for chunk in response.iter_raw():
                chunks.append(chunk)
                if time.monotonic() > end:
                    raise _late(request, self._deadline)
        finally:
            response.close()
        return _whole(response, b"".join(chunks))

    def _post(self, path: str, fields: dict[str, Any]) -> Result:
        content, headers = self._body(fields)
        return _result(self._send("POST", path, content=content, headers=headers))

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok", "version": …}`` while the service runs."""
        return dict(_json(self._send("GET", "/healthz", retry_503=False)))

    def ready(self) -> bool:
        """``GET /readyz``: whether the service has finished starting."""
        return self._send("GET", "/readyz", retry_503=False).status_code == 200

    def version(self) -> dict[str, Any]:
        """``GET /version``: service, Python, NumPy and BLAS versions."""
        return dict(_json(self._send("GET", "/version", retry_503=False)))

    def models(self) -> list[dict[str, Any]]:
        """``GET /models``: the trained models :meth:`model` can run, and whether each is
        installed on the service."""
        return list(_json(self._send("GET", "/models", retry_503=False)))

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(_Common, _Endpoints[Coroutine[Any, Any, Result]]):
    """The asynchronous twin of :class:`Client`: the same arguments and methods, awaited
    (``await client.attention(...)``); ``async with`` or :meth:`aclose`. ``transport`` is an
    ``httpx.AsyncBaseTransport`` (e.g. ``httpx.ASGITransport(app=…)``), ``sleep`` an async
    function (default ``asyncio.sleep``). :meth:`local` runs the service in process."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        binary: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(max_retries, binary, jitter)
        self._sleep = sleep
        self._deadline = _deadline(timeout)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            headers=_headers(api_key, binary, headers),
        )

    @classmethod
    def local(
        cls,
        api_key: str | None = None,
        *,
        app: ASGIApp | None = None,
        max_retries: int = 3,
        binary: bool = True,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> Self:
        """The service run inside this process, as :meth:`Client.local`, on the caller's
        asyncio loop (through ``httpx.ASGITransport``): the app starts with the first request
        and shuts down with :meth:`aclose` (or the ``async with`` block)."""
        transport = AsyncLocalTransport(app if app is not None else service_app())
        return cls(
            LOCAL_URL,
            api_key,
            max_retries=max_retries,
            binary=binary,
            transport=transport,
            headers=headers,
            sleep=sleep,
            jitter=jitter,
        )

    async def _send(
        self, method: str, path: str, *, retry_503: bool = True, **kw: Any
    ) -> httpx.Response:
        """One request, tried again as ``_wait`` says."""
        attempt = 0
        while True:
            try:
                response = await self._within_deadline(self._http.build_request(method, path, **kw))
            except RETRIED:
                wait = self._retry_wait(attempt, None, retry_503)
                if wait is None:
                    raise
            else:
                wait = self._retry_wait(attempt, response, retry_503)
                if wait is None:
                    return response
            await self._sleep(wait)
            attempt += 1

    async def _within_deadline(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and read its answer, within the deadline of one try."""
        end = time.monotonic() + self._deadline
        response = await self._http.send(request, stream=True)
        if response.is_stream_consumed:  # answered whole (a mock or in-process transport)
            return response
        try:
            chunks = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if time.monotonic() > end:
                    raise _late(request, self._deadline)
        finally:
            await response.aclose()
        return _whole(response, b"".join(chunks))

    def _post(self, path: str, fields: dict[str, Any]) -> Coroutine[Any, Any, Result]:
        content, headers = self._body(fields)  # at once: a bad argument raises at the call

        async def post() -> Result:
            return _result(await self._send("POST", path, content=content, headers=headers))

        return post()

    async def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok", "version": …}`` while the service runs."""
        return dict(_json(await self._send("GET", "/healthz", retry_503=False)))

    async def ready(self) -> bool:
        """``GET /readyz``: whether the service has finished starting."""
        return (await self._send("GET", "/readyz", retry_503=False)).status_code == 200

    async def version(self) -> dict[str, Any]:
        """``GET /version``: service, Python, NumPy and BLAS versions."""
        return dict(_json(await self._send("GET", "/version", retry_503=False)))

    async def models(self) -> list[dict[str, Any]]:
        """``GET /models``: the trained models :meth:`model` can run, and whether each is
        installed on the service."""
        return list(_json(await self._send("GET", "/models", retry_503=False)))

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
