"""Pipelined rounds of the lean client (stream chunks, docs/protocol.md §2.4), over real
loopback."""

from __future__ import annotations

import logging
import tracemalloc

import pytest
import trio

from trio_worker import TransportError
from trio_worker._config import MAX_ANSWER_BYTES, Timings, platform_from_env
from trio_worker._platform._client import PlatformClient
from trio_worker._platform._connection import Connection
from trio_worker._platform._http import HttpPool, HttpResponse
from trio_worker._platform._request import PipeliningUnsupported

from .scripted_server import (
    STATIC_HEADERS,
    TIMEOUT,
    Reply,
    Server,
    StrayAnswer,
    assert_no_resource_warning,
    client_fixture,  # noqa: F401 (a fixture)
    response,
    send_one,
    server_fixture,  # noqa: F401 (a fixture)
    split,
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------------------
# Pipelining (stream chunks, docs/protocol.md §2.4)
# --------------------------------------------------------------------------------------

BODIES = [b'{"output": 0}', b'{"output": 1}', b'{"output": 2}']


def to(url: str, bodies: list[bytes]) -> list[tuple[str, bytes]]:
    return [(url, body) for body in bodies]


async def pipeline(
    client: HttpPool, server: Server, bodies: list[bytes] = BODIES
) -> list[HttpResponse]:
    answers: list[HttpResponse] = []
    await client.exchange("POST", to(server.url("/job-stream/w/j?x=1"), bodies), answers)
    return answers


def platform_env(server: Server) -> dict[str, str]:
    base = server.url("/v2/ep1")
    return {
        "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID",
        "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID",
        "RUNPOD_WEBHOOK_POST_STREAM": f"{base}/job-stream/$RUNPOD_POD_ID/$ID",
        "RUNPOD_AI_API_KEY": "k",
        "RUNPOD_POD_ID": "w1",
    }


async def prove(client: HttpPool | PlatformClient, server: Server) -> None:
    """One request before the round: its answer shows the origin keeps HTTP/1.1
    connections, which requests must see before they share a write (its connection is
    pooled, and the round reuses it)."""
    server.reply(response(b"proof"))
    with trio.fail_after(TIMEOUT):
        polls = client.polls if isinstance(client, PlatformClient) else client
        assert (await send_one(polls, "GET", server.url("/proof"))).body == b"proof"


@pytest.fixture
async def proven(server: Server, client: HttpPool) -> HttpPool:
    """The client, once the server's first answer has shown it may be pipelined to:
    ``server.requests[0]`` is that proof."""
    await prove(client, server)
    return client


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    server: Server, proven: HttpPool
) -> None:
    client = proven
    # All three answers in one write: each must be cut at its own end.
    server.reply(response(b"a") + response(b"b", "503 Busy") + response(b"c", "201 Created"))
    server.reply()
    server.reply()
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        after = await send_one(client, "GET", server.url("/after"))
    assert [(a.status, a.body) for a in answers] == [(200, b"a"), (503, b"b"), (201, b"c")]
    assert after.body == b"after"
    assert server.accepted == 1  # kept alive, and reused
    assert [(r.method, r.target, r.body) for r in server.requests[1:4]] == [
        ("POST", "/job-stream/w/j?x=1", body) for body in BODIES
    ]
    assert all(r.header("Content-Length") == str(len(r.body)) for r in server.requests[1:4])


async def test_requests_of_several_urls_go_in_one_pipeline_but_never_to_two_origins(
    server: Server, proven: HttpPool
) -> None:
    client = proven
    server.reply(response(b"a") + response(b"b"))  # both answers in one write
    server.reply()
    server.reply(response(b"after"))
    first, second = server.url("/job-stream/w/a"), server.url("/job-stream/w/b?x=1")
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT):
        await client.exchange("POST", [(first, b"1"), (second, b"2")], answers)
        # Served after both pipelined requests: the server has recorded them.
        assert (await send_one(client, "GET", server.url("/after"))).body == b"after"
    assert [a.body for a in answers] == [b"a", b"b"]
    assert [(r.target, r.body) for r in server.requests[1:3]] == [
        ("/job-stream/w/a", b"1"),
        ("/job-stream/w/b?x=1", b"2"),
    ]
    elsewhere = first.replace("127.0.0.1", "localhost", 1)
    assert elsewhere != first
    with pytest.raises(TransportError, match=r"cannot pipeline requests to .* on one connection"):
        await client.exchange("POST", [(first, b"3"), (elsewhere, b"4")], answers)
    assert len(server.requests) == 4  # refused before anything was written
    assert server.accepted == 1


async def test_connection_close_ends_a_pipeline_with_the_answers_so_far(
    server: Server, proven: HttpPool
) -> None:
    client = proven
    server.reply(response(b"a", headers=("Connection: close",)), then="close")
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="after 1 of 3 pipelined"):
        await client.exchange("POST", to(server.url("/s"), BODIES), answers)
    assert [a.body for a in answers] == [b"a"]


@pytest.mark.parametrize(
    "second", [b"HTTP/1.1 2OO OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"]
)
async def test_a_bad_answer_mid_pipeline_keeps_the_earlier_answers(
    server: Server, client: HttpPool, second: bytes
) -> None:
    server.reply(response(b"a"))
    server.reply(second, then="close")
    server.reply(response(b"fresh"))
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError):
            await client.exchange("POST", to(server.url("/s"), BODIES), answers)
        assert [a.body for a in answers] == [b"a"]
        # The broken connection was not pooled.
        assert (await send_one(client, "GET", server.url("/next"))).body == b"fresh"
    assert server.accepted == 2


async def test_a_stale_connection_sends_the_whole_batch_again_once(
    server: Server, client: HttpPool
) -> None:
    server.reply(response(b"warm"))
    for body in (b"a", b"b", b"c"):
        server.reply(response(body))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/warm"))).body == b"warm"
        idle = server.peers[0]
        await idle.close()
        await idle.done.wait()
        answers = await pipeline(client, server)
    assert [a.body for a in answers] == [b"a", b"b", b"c"]
    # Nothing reached the closed connection; each body reached the fresh one once.
    assert [(r.connection, r.body) for r in server.requests[1:]] == [(1, b) for b in BODIES]


async def test_a_close_after_some_answers_is_never_taken_for_a_stale_connection(
    server: Server, client: HttpPool
) -> None:
    server.reply(response(b"warm"))
    server.reply(response(b"a"), then="close")  # no "Connection: close": just gone
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/warm"))).body == b"warm"
        answers: list[HttpResponse] = []
        with pytest.raises(TransportError):
            await client.exchange("POST", to(server.url("/s"), BODIES), answers)
    assert [a.body for a in answers] == [b"a"]
    # Processed requests were not sent again: what followed the answered one is the
    # caller's to send again, not the client's.
    assert server.accepted == 1


async def test_a_cancelled_pipeline_keeps_its_answers_and_closes_its_connection(
    server: Server, client: HttpPool
) -> None:
    server.reply(response(b"a"))
    server.reply(b"", response(b"b"), pause=10.0)  # far too late
    server.reply(response(b"after"))
    answers: list[HttpResponse] = []
    with trio.move_on_after(0.05) as scope:
        await client.exchange("POST", to(server.url("/s"), BODIES[:2]), answers)
    assert scope.cancelled_caught
    assert [a.body for a in answers] == [b"a"]
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/after"))).body == b"after"
    assert server.accepted == 2  # the cut connection was closed, not pooled
    assert_no_resource_warning()


async def test_a_chunked_answer_mid_round_is_read_and_the_answers_behind_it(
    server: Server, proven: HttpPool
) -> None:
    client = proven
    # The second answer is chunked: llhttp reads it whole, then the third.
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nbb\r\n0\r\n\r\n"
    server.reply(response(b"a") + chunked + response(b"c", "429 Too Many", ("Retry-After: 3",)))
    server.reply()
    server.reply()
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        after = await send_one(client, "GET", server.url("/after"))
    assert [(a.status, a.body) for a in answers] == [(200, b"a"), (200, b"bb"), (429, b"c")]
    assert answers[2].headers["retry-after"] == "3"
    assert after.body == b"after"
    assert server.accepted == 1  # both sides done: reused


async def test_answers_dripping_in_byte_by_byte_are_read_whole_each_byte_parsed_once(
    server: Server, client: HttpPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A head dripping in must not be parsed over again at each byte (a parser that
    # re-reads an unfinished head would be quadratic in it): llhttp keeps its place, and
    # each byte is handed to it once.
    parsed: list[int] = []
    parse = Connection._parse

    def counted(self: Connection, data: bytes | bytearray) -> None:
        parsed.append(len(data))
        parse(self, data)

    monkeypatch.setattr(Connection, "_parse", counted)
    wire = response(b"a") + response(b"bb", "503 Busy") + response(b"ccc")
    server.reply(*split(wire, 1), pause=0.0005)
    server.reply()
    server.reply()
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
    assert [(a.status, a.body) for a in answers] == [(200, b"a"), (503, b"bb"), (200, b"ccc")]
    assert sum(parsed) == len(wire)


async def test_bytes_past_the_last_pipelined_answer_end_the_connection(
    server: Server, proven: HttpPool
) -> None:
    client = proven
    server.reply(response(b"a") + response(b"b") + response(b"c") + b"HTTP/1.1 200 OK\r\n")
    server.reply()
    server.reply()
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        fresh = await send_one(client, "GET", server.url("/next"))
    assert [a.body for a in answers] == [b"a", b"b", b"c"]
    assert fresh.body == b"fresh"
    assert server.accepted == 2  # out of step: not pooled


@pytest.mark.parametrize("cut", [0, 5, 40])
async def test_a_close_inside_a_pipelined_answer_says_so(
    server: Server, proven: HttpPool, cut: int
) -> None:
    client = proven
    server.reply(response(b"a") + response(b"bbbbbbbbbb")[:cut], then="close")
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError) as caught:
        await client.exchange("POST", to(server.url("/s"), BODIES), answers)
    assert [a.body for a in answers] == [b"a"]
    want = "after 1 of 3 pipelined" if cut == 0 else "before answering in full"
    assert want in str(caught.value)


# --------------------------------------------------------------------------------------
# Servers that do not keep HTTP/1.1 connections (HTTP/1.0, answers delimited by a close)
# --------------------------------------------------------------------------------------


class CountedWrites(trio.abc.Stream):
    """A TCP stream that notes how many requests each write carries."""

    def __init__(self, inner: trio.abc.Stream, writes: list[int]) -> None:
        self._inner = inner
        self._writes = writes

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._writes.append(bytes(data).count(b" HTTP/1.1\r\n"))
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._inner.receive_some(max_bytes)

    async def send_eof(self) -> None:  # pragma: no cover - the client never half-closes
        raise NotImplementedError

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_round_to_an_origin_not_yet_heard_sends_its_first_request_alone(
    server: Server,
) -> None:
    writes: list[int] = []

    async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
        return CountedWrites(await trio.open_tcp_stream(host, port), writes)

    client = HttpPool(STATIC_HEADERS, open_stream=open_stream)
    server.reply(response(b"a"))
    server.reply(response(b"b") + response(b"c"))
    server.reply()
    server.reply(response(b"d") + response(b"e"))
    server.reply()
    try:
        with trio.fail_after(TIMEOUT):
            answers = await pipeline(client, server)
            again = await pipeline(client, server, BODIES[:2])  # the origin is known now
    finally:
        await client.aclose()
    assert [a.body for a in answers] == [b"a", b"b", b"c"]
    assert [a.body for a in again] == [b"d", b"e"]
    assert writes == [1, 2, 2]  # alone until the first answer showed a kept connection
    assert server.accepted == 1  # and that connection carried the rest


HTTP10_KEEP_ALIVE = response(b"b", headers=("Connection: keep-alive",), version="HTTP/1.0")


async def test_an_http10_keep_alive_answer_mid_round_reads_the_answers_behind_it(
    server: Server, proven: HttpPool
) -> None:
    # h11 closes after any HTTP/1.0 answer, so the chunks behind it were taken for lost
    # and sent again, though this server had processed them: stored twice. Their
    # answers are read; then the origin is never pipelined to again.
    client = proven
    server.reply(response(b"a") + HTTP10_KEEP_ALIVE + response(b"c"))
    server.reply()
    server.reply()
    server.reply(response(b"alone"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        assert [(a.status, a.body) for a in answers] == [(200, b"a"), (200, b"b"), (200, b"c")]
        with pytest.raises(PipeliningUnsupported, match=r"answers in HTTP/1\.0"):
            await pipeline(client, server)
        assert (await send_one(client, "GET", server.url("/alone"))).body == b"alone"
    assert [r.body for r in server.requests[1:4]] == BODIES  # each once
    assert len(server.requests) == 5  # the refused round sent nothing
    assert server.accepted == 2  # the HTTP/1.0 connection was not kept


@pytest.mark.parametrize(
    "first",
    [
        response(b"a", headers=("Connection: keep-alive",), version="HTTP/1.0"),
        response(b"a", version="HTTP/1.0"),
        response(b"a", length=False),  # its end is the close
    ],
    ids=["HTTP/1.0 keep-alive", "HTTP/1.0", "close-delimited"],
)
async def test_an_origin_whose_first_answer_is_not_persistent_http11_is_never_pipelined_to(
    server: Server, client: HttpPool, first: bytes
) -> None:
    server.reply(first, then="close")
    server.reply(response(b"b"))
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT):
        with pytest.raises(PipeliningUnsupported):
            await client.exchange("POST", to(server.url("/s"), BODIES), answers)
        assert [a.body for a in answers] == [b"a"]
        assert [r.body for r in server.requests] == BODIES[:1]  # the rest never sent
        # One request at a time still goes, each on a connection of its own.
        assert (await send_one(client, "POST", server.url("/s"), b"1")).body == b"b"
    assert server.accepted == 2


async def test_the_platform_client_turns_pipelining_off_for_such_an_origin(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_worker")
    client = PlatformClient(platform_from_env(platform_env(server)), Timings())
    server.reply(response(b"", "204 No Content", version="HTTP/1.0"))  # a take's answer
    chunks = [(client.stream_url("j1"), b"%d" % n) for n in range(3)]
    try:
        with trio.fail_after(TIMEOUT):
            await send_one(client.polls, "GET", server.url("/take"))
            assert await client.post(chunks) == []
    finally:
        await client.aclose()
    assert not client.pipelining
    assert len(server.requests) == 1  # no chunk was written
    assert "stream chunks now go one request at a time" in caplog.text
    assert "answers in HTTP/1.0" in caplog.text


# --------------------------------------------------------------------------------------
# Answers nobody asked for, and the bytes a round may hold
# --------------------------------------------------------------------------------------

NO_CONTENT_WITH_BODY = b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize("separate_writes", [False, True])
async def test_a_204_with_a_body_mid_round_is_not_taken_for_the_next_answer(
    server: Server, proven: HttpPool, separate_writes: bool
) -> None:
    client = proven
    # Regression: the body of a 204 was read as the next chunk's answer; the round failed
    # after its first answer and the chunks behind it, which the platform had stored,
    # were sent (and stored) again. The 204's declared body is skipped, every chunk is
    # answered, and the connection that was out of step is closed after the round.
    parts = [NO_CONTENT_WITH_BODY[:-2], b"{}"] if separate_writes else [NO_CONTENT_WITH_BODY]
    server.replies.append(Reply(parts * 3 if separate_writes else [NO_CONTENT_WITH_BODY * 3]))
    server.reply()
    server.reply()
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        after = await send_one(client, "GET", server.url("/after"))
    assert [a.status for a in answers] == [204, 204, 204]
    assert len(server.requests) == 5  # the proof, each chunk once, then the next request
    assert after.body == b"after"
    assert server.accepted == 2  # never reused


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        b'HTTP/1.1 304 Not Modified\r\nContent-Length: 120\r\nETag: "x"\r\n\r\n',
    ],
)
async def test_a_204_or_304_framed_as_rfc9112_says_mid_round_is_read_as_such(
    server: Server, proven: HttpPool, head: bytes
) -> None:
    client = proven
    # A Content-Length on a 204 or 304 with no body behind it (a 304 may name the
    # length of what it stands for): the next answer follows its head at once.
    server.reply(head + response(b"b") + response(b"c"))
    server.reply()
    server.reply()
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        after = await send_one(client, "GET", server.url("/after"))
    assert [(a.status, a.body) for a in answers[1:]] == [(200, b"b"), (200, b"c")]
    assert answers[0].status in (204, 304)
    assert after.body == b"after"
    assert server.accepted == 1


async def test_a_204_declaring_a_chunked_body_mid_round_fails_closed(
    server: Server, proven: HttpPool
) -> None:
    client = proven
    server.reply(
        b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        + response(b"b")
        + response(b"c")
    )
    server.reply()
    server.reply()
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="malformed answer"):
        await client.exchange("POST", to(server.url("/s"), BODIES), answers)
    assert [a.status for a in answers] == [204]
    assert_no_resource_warning()


async def test_bytes_arriving_after_the_last_answer_of_a_round_end_the_connection(
    server: Server, client: HttpPool
) -> None:
    # In a later write than the last answer: the quiet check sees them before reuse.
    script = StrayAnswer(server, b"HTTP/1.1 200 OK\r\n", after=3)  # the proof, then 2
    await prove(client, server)
    server.reply(response(b"a") + response(b"b"))
    server.reply()
    server.reply(response(b"after"))
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT):
        await client.exchange("POST", to(server.url("/s"), BODIES[:2]), answers)
        script.answers_read.set()
        await script.stray_sent.wait()
        await trio.sleep(0.005)  # the stray bytes cross loopback
        after = await send_one(client, "GET", server.url("/after"))
    assert [a.body for a in answers] == [b"a", b"b"]
    assert after.body == b"after"
    assert server.accepted == 2


async def test_a_round_keeps_a_bounded_part_of_each_answer(server: Server) -> None:
    # Regression: 1 MiB answers to pipelined chunks took the worker to 326 MiB. A client
    # made for answers that matter by their status keeps a little of each body, reads
    # and drops the rest, and holds one read at a time.
    big = b"x" * MAX_ANSWER_BYTES
    count = 16
    client = HttpPool(STATIC_HEADERS, keep_body=4096)
    await prove(client, server)
    server.reply(*[response(big)] * count)
    for _ in range(count - 1):
        server.reply()
    answers: list[HttpResponse] = []
    try:
        with trio.fail_after(TIMEOUT):
            tracemalloc.start()
            try:
                await client.exchange("POST", to(server.url("/s"), [b"{}"] * count), answers)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        await client.aclose()
    assert [a.status for a in answers] == [200] * count
    assert all(a.body == big[:4096] for a in answers)
    assert peak < MAX_ANSWER_BYTES  # one answer's worth is already too much


async def test_a_round_of_stream_chunks_holds_little_however_large_the_answers(
    server: Server,
) -> None:
    # Regression, through the platform client: 1 MiB answers to pipelined chunks took the
    # worker to 326 MiB (35 MiB normally). Only the statuses matter; a round of 16 such
    # answers must not hold even one of them whole.
    big = b"x" * MAX_ANSWER_BYTES
    count = 16
    config = platform_from_env(platform_env(server))
    client = PlatformClient(config, Timings())
    chunks = [(client.stream_url("j1"), b'{"output": %d}' % n) for n in range(count)]
    await prove(client, server)  # as the take's answer does before any chunk
    server.reply(*[response(big)] * count)
    for _ in range(count - 1):
        server.reply()
    try:
        with trio.fail_after(TIMEOUT):
            tracemalloc.start()
            try:
                answers = await client.post(chunks)
                _, peak = tracemalloc.get_traced_memory()
                kept = sum(len(answer.body) for answer in answers)
            finally:
                tracemalloc.stop()
    finally:
        await client.aclose()
    assert [a.status for a in answers] == [200] * count
    assert kept <= count * 4096
    assert peak < MAX_ANSWER_BYTES
