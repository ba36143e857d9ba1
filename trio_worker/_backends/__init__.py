"""Where and how the user's code runs: the handler's calls and the kept threads of sync code
(``_handler_calls``), and the loop of async code, one interface (:class:`Backend`) with one
class per backend, chosen once by the options (docs/how-it-works.md, the module map and "The
asyncio backend"). ``_asyncio`` (and asyncio) is imported only when a worker asks for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ._interface import AsyncBackend as AsyncBackend
from ._interface import Backend as Backend
from ._interface import Holds as Holds
from ._interface import default_backend as default_backend
from ._interface import makes_coroutine as makes_coroutine
from ._interface import unwrap_callable as unwrap_callable
from ._trio import TrioBackend

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    import trio

T = TypeVar("T")


class _Backends(Mapping[str, Backend]):
    """The backends by name, each built once, the asyncio one when first asked for."""

    def __init__(self) -> None:
        self._built: dict[str, Backend] = {"trio": TrioBackend()}

    def __getitem__(self, name: str) -> Backend:
        try:
            return self._built[name]
        except KeyError:
            if name != "asyncio":
                raise
        from ._asyncio import AsyncioBackend

        return self._built.setdefault(name, AsyncioBackend())

    def __iter__(self) -> Iterator[str]:
        return iter(("trio", "asyncio"))

    def __len__(self) -> int:
        return 2


BACKENDS: Mapping[str, Backend] = _Backends()


def run_asyncio_host(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: tuple[trio.abc.Instrument, ...] | list[trio.abc.Instrument] = (),
) -> T:
    """Like ``trio.run(async_fn, *args)``, with trio as a guest on a new asyncio loop.

    Inside, trio code and asyncio code share one thread: a worker served here with
    ``async_backend="asyncio"`` runs its async handlers on this loop. Its signature matches
    ``trio.run`` so pytest-trio can use it (``@pytest.mark.trio(run=run_asyncio_host)``).

    Raises:
        asyncio.CancelledError: asyncio code cancelled the loop's main task (the trio run
            is cancelled then, and has ended).
    """
    from ._host import host_run

    return host_run(async_fn, *args, clock=clock, instruments=tuple(instruments))
