"""The pool's socket stream (trio_worker/_platform/_network.py): it yields only to
wait, and still behaves as a trio stream where it matters (closing, conflicts, a large
write, the end of the peer)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from trio_worker._platform._http import QuietProbe
from trio_worker._platform._network import LeanSocketStream

TIMEOUT = 5.0  # a safety bound on each wait; never reached when the code is right


@pytest.fixture
def pair() -> Iterator[tuple[LeanSocketStream, socket.socket]]:
    ours, peer = socket.socketpair()
    stream = LeanSocketStream(ours)
    yield stream, peer
    ours.close()
    peer.close()


async def test_a_read_of_bytes_already_here_does_not_yield(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, peer = pair
    peer.sendall(b"abc")
    with trio.testing.assert_no_checkpoints():
        assert await stream.receive_some(16) == b"abc"


async def test_a_read_that_fills_its_buffer_lets_the_other_tasks_run(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, peer = pair
    peer.sendall(b"abcdef")
    with trio.testing.assert_checkpoints():
        assert await stream.receive_some(4) == b"abcd"


async def test_a_read_waits_for_bytes_and_sees_the_peers_close(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, peer = pair
    async with trio.open_nursery() as nursery:

        async def later() -> None:
            await trio.testing.wait_all_tasks_blocked()
            peer.sendall(b"late")
            await trio.testing.wait_all_tasks_blocked()
            peer.close()

        nursery.start_soon(later)
        with trio.fail_after(TIMEOUT):
            assert await stream.receive_some(16) == b"late"
            assert await stream.receive_some(16) == b""


class CountingSocket(socket.socket):
    """A socket that counts its ``recv`` calls."""

    recvs = 0

    def recv(self, size: int, flags: int = 0) -> bytes:
        self.recvs += 1
        return super().recv(size, flags)


async def test_the_first_read_after_a_write_waits_for_the_answer_instead_of_finding_none() -> None:
    ours, peer = socket.socketpair()
    counting = CountingSocket(fileno=ours.detach())
    stream = LeanSocketStream(counting)
    try:
        async with trio.open_nursery() as nursery:

            async def answer() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert counting.recvs == 0  # parked on the socket, no empty read first
                assert peer.recv(16) == b"ask"
                peer.sendall(b"answer")

            nursery.start_soon(answer)
            await stream.send_all(b"ask")
            with trio.fail_after(TIMEOUT):
                assert await stream.receive_some(16) == b"answer"
        assert counting.recvs == 1
        # A later read with nothing sent in between tries the socket first, as before.
        peer.sendall(b"more")
        with trio.testing.assert_no_checkpoints():
            assert await stream.receive_some(16) == b"more"
        assert counting.recvs == 2
    finally:
        counting.close()
        peer.close()


async def test_a_write_larger_than_the_socket_buffer_goes_out_whole(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, peer = pair
    payload = bytes(range(256)) * 16384  # 4 MiB: more than the kernel takes at once
    received = bytearray()
    peer.setblocking(False)

    async def drain() -> None:
        while len(received) < len(payload):
            await trio.lowlevel.wait_readable(peer)
            received.extend(peer.recv(1 << 20))

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await stream.send_all(payload)
    assert bytes(received) == payload


async def test_closing_wakes_a_reader_with_closed_resource_error(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, _ = pair
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await stream.receive_some(16)

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await stream.send_all(b"x")
    with pytest.raises(trio.ClosedResourceError):
        await stream.receive_some(16)


async def test_two_readers_at_once_is_a_busy_resource(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, peer = pair
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.receive_some, 16)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await stream.receive_some(16)
            peer.sendall(b"x")


async def test_a_reset_by_the_peer_is_a_broken_resource(
    pair: tuple[LeanSocketStream, socket.socket],
) -> None:
    stream, peer = pair
    peer.shutdown(socket.SHUT_RDWR)
    peer.close()

    async def write_until_refused() -> None:
        for _ in range(64):  # the first writes may still be taken by the kernel
            await stream.send_all(b"x" * 65536)

    with trio.fail_after(TIMEOUT), pytest.raises(trio.BrokenResourceError):
        await write_until_refused()


async def test_the_quiet_check_sees_a_byte_and_a_socket_closed_under_it() -> None:
    # The probe keeps one poll of its socket across checks: it must still see a byte that
    # arrives later, and a socket closed meanwhile must never count as quiet.
    ours, peer = socket.socketpair()
    probe = QuietProbe(LeanSocketStream(ours))
    try:
        assert probe.quiet()
        assert probe.quiet()  # asked again, through the same poll
        peer.sendall(b"H")
        assert not probe.quiet()
        ours.recv(1)
        assert probe.quiet()
        ours.close()
        assert not probe.quiet()
    finally:
        ours.close()
        peer.close()
