"""A platform (or a middlebox in front of it) that does not speak persistent HTTP/1.1.

Stream chunks are pipelined on a kept-alive connection (docs/protocol.md §2.4), which only
an HTTP/1.1 server that keeps its connections can take. Two others are met in the wild: one
that answers in HTTP/1.0 with ``Connection: keep-alive`` (h11, like RFC 9112 §9.3, reads
such a connection as closing after the answer), and one whose answers end where it closes
the connection (no ``Content-Length``). Both process the requests a pipelined write put in
their buffer, whatever they then answer: a chunk that went in such a write and is sent
again is stored twice. Such a platform gets one request per connection, and every chunk
once.

The platform here is played over in-memory streams, in virtual time: it processes every
complete request it has read, as the servers that stored chunks twice did.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

import pytest
import trio
import trio.testing

import trio_worker.testing
from trio_worker import Timings
from trio_worker.testing import FakePlatform

from .backends import BOTH_BACKENDS, sleep_for

pytestmark = pytest.mark.timeout(60)

Framing = Literal["HTTP/1.0 keep-alive", "close-delimited"]
CHUNKS = 800


class OldHttpPlatform:
    """Take, job-stream, job-done, ping and stop routes of one streamed job, answered in
    *framing*; every chunk and final report received is recorded."""

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self.taken = False
        self.chunks: list[Any] = []
        self.finals: list[Any] = []
        self.connections = 0
        self.finished = trio.Event()

    def answer(self, target: str, body: bytes) -> tuple[int, bytes]:
        """Process one request: its status and body."""
        if "/job-take/" in target:
            if self.taken:
                return 204, b""
            self.taken = True
            return 200, json.dumps({"id": "job-1", "input": {}}).encode()
        if "/job-stream/" in target:
            self.chunks.append(json.loads(body)["output"])
            return 200, b""
        if "/job-done/" in target:
            self.finals.append(json.loads(body))
            self.finished.set()
            return 200, b""
        return 204, b""  # ping, job-stop

    async def serve(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        buffer = bytearray()
        try:
            while True:
                request = await _read_request(stream, buffer)
                if request is None:
                    return
                status, body = self.answer(*request)
                reason = b"OK" if status == 200 else b"No Content"
                kind = b"Content-Type: application/json\r\n"
                if self.framing == "HTTP/1.0 keep-alive":
                    head = b"HTTP/1.0 %d %s\r\nConnection: keep-alive\r\n" % (status, reason)
                    length = b"Content-Length: %d\r\n\r\n" % len(body)
                    await stream.send_all(head + kind + length + body)
                    continue
                await stream.send_all(b"HTTP/1.1 %d %s\r\n%s\r\n" % (status, reason, kind) + body)
                # The answer ends where the connection does: what else was written to it
                # is processed, never answered.
                while (request := _parse_request(buffer)) is not None:
                    self.answer(*request)
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)


def _parse_request(buffer: bytearray) -> tuple[str, bytes] | None:
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if len(buffer) < end + 4 + length:
        return None
    body = bytes(buffer[end + 4 : end + 4 + length])
    del buffer[: end + 4 + length]
    return lines[0].split(" ")[1], body


async def _read_request(stream: trio.abc.Stream, buffer: bytearray) -> tuple[str, bytes] | None:
    while (request := _parse_request(buffer)) is None:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    return request


def many_chunks(backend: str) -> Any:
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        for n in range(CHUNKS):
            yield n
            if n % 100 == 99:
                await sleep(0.01)  # chunks pile up behind one in flight, in rounds

    return stream


@BOTH_BACKENDS
@pytest.mark.parametrize("framing", ["HTTP/1.0 keep-alive", "close-delimited"])
async def test_a_platform_without_persistent_http11_gets_every_chunk_once(
    backend: str, framing: Framing, virtual_clock: trio.abc.Clock
) -> None:
    platform = OldHttpPlatform(framing)
    async with trio.open_nursery() as network:

        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            client, server = trio.testing.memory_stream_pair()
            network.start_soon(platform.serve, server)
            await trio.lowlevel.checkpoint()
            return client

        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(
                    trio_worker.testing.serve,
                    many_chunks(backend),
                    async_backend=backend,  # type: ignore[arg-type]
                    environ=FakePlatform().worker_env("http://platform"),
                    open_stream=open_stream,
                    heartbeat="task",
                    handle_signals=False,
                    capture_logs="off",
                    timings=Timings(),
                )
            )
            with trio.fail_after(600):
                await platform.finished.wait()
            nursery.cancel_scope.cancel()
        network.cancel_scope.cancel()
    assert len(platform.finals) == 1
    assert "undelivered_chunk_count" not in platform.finals[0]
    twice = len(platform.chunks) - len(set(platform.chunks))
    assert twice == 0, f"{twice} of {CHUNKS} chunks stored twice"
    assert sorted(platform.chunks) == list(range(CHUNKS))
