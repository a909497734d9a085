"""A streamed answer's pieces are made by one thread, at most AHEAD_CHUNKS ahead of the writer
(service.http.routes._made_ahead): all of them in order, its errors raised to the writer, and
the thread stopped once the writer stops."""

import asyncio
import threading
from collections.abc import Iterator

import pytest

from service.http.routes import AHEAD_CHUNKS, _made_ahead


def test_every_piece_comes_in_order_from_one_thread_never_far_ahead() -> None:
    made: list[int] = []
    threads: set[int] = set()

    def pieces() -> Iterator[bytes]:
        for i in range(50):
            threads.add(threading.get_ident())
            made.append(i)
            yield b"%d," % i

    async def scenario() -> list[bytes]:
        got: list[bytes] = []
        async for piece in _made_ahead(pieces()):
            await asyncio.sleep(0.001)  # a slow socket
            # made, not yet written: this one, those queued, and the one being made
            assert len(made) - len(got) <= 1 + AHEAD_CHUNKS + 1
            got.append(bytes(piece))
        return got

    assert asyncio.run(scenario()) == [b"%d," % i for i in range(50)]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_an_error_while_making_reaches_the_writer() -> None:
    def pieces() -> Iterator[bytes]:
        yield b"first"
        raise ValueError("encoding failed")

    async def scenario() -> list[bytes]:
        return [bytes(p) async for p in _made_ahead(pieces())]

    with pytest.raises(ValueError, match="encoding failed"):
        asyncio.run(scenario())


def test_the_thread_stops_when_the_writer_stops() -> None:
    """A client gone after two pieces: the thread makes at most a few more, not the 10,000."""
    made: list[int] = []

    def pieces() -> Iterator[bytes]:
        for i in range(10_000):
            made.append(i)
            yield b"x" * 1000

    async def scenario() -> None:
        stream = _made_ahead(pieces())
        async for _ in stream:
            if len(made) >= 2:
                break
        await stream.aclose()
        await asyncio.sleep(0.2)  # time for a thread that did not stop to make many more

    asyncio.run(scenario())
    assert len(made) <= 2 + AHEAD_CHUNKS + 2, len(made)
