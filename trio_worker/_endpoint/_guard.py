"""Who may talk to the local endpoint: a local Host, its own origin, typed JSON, the key.

The local endpoint listens on the developer's machine, where every web page the
developer opens can send it requests (docs/security.md). A browser lets a page send a
"simple" request (a GET, or a POST typed ``text/plain``, form-encoded or multipart) to
any origin without asking first; it only hides the answer. So the endpoint checks,
before any route runs:

- **Host**: only ``localhost``, ``127.0.0.1``, ``[::1]`` or the ``--rp_api_host`` name,
  with the port served. A page on ``attacker.example`` whose name was rebound to
  127.0.0.1 (DNS rebinding) is same-origin for its browser, but its requests still carry
  ``Host: attacker.example``.
- **Origin / Sec-Fetch-Site**: a request that a browser marks as coming from another
  origin (``Origin`` other than the endpoint's own, ``Sec-Fetch-Site`` other than
  ``same-origin`` or ``none``) is refused; only a top-level navigation to the page itself
  is let through, and the page forbids being framed. Tools such as curl or the runpod
  SDK send neither header.
- **Content-Type**: a body sent to an endpoint API route must be ``application/json``,
  which a page cannot send cross-origin without a CORS preflight (and the endpoint
  answers none): the pattern of FastAPI's CVE-2021-32677.
- **The key**: worker routes (take, done, stream, stop, ping) need the per-run key the
  embedded worker is given (:class:`~._app.EndpointApp`); a page cannot send an
  ``Authorization`` header cross-origin without a preflight either.

What the page itself needs is allowed explicitly: its own origin (``Origin`` equal to
``http://`` and the Host it was loaded from), ``Sec-Fetch-Site: same-origin``, and JSON
bodies, which is what its script sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["LOCAL_NAMES", "Guard", "Refusal"]

#: Host names that always mean this machine.
LOCAL_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")
#: Endpoint API routes whose request must carry a JSON body.
BODY_ROUTES: Final = frozenset({"api_run", "api_runsync"})
#: Routes a top-level navigation from elsewhere may open (a link to the page).
NAVIGABLE: Final = frozenset({"page"})
_OWN_SITE: Final = frozenset({"same-origin", "none"})


@dataclass(frozen=True)
class Refusal:
    """A request turned away: the status and a one-line reason."""

    status: int
    reason: str


@dataclass(frozen=True)
class Guard:
    """The checks of the module docstring, for an endpoint served under *names*.

    The port is the one each request arrived on (the ASGI ``server`` of its scope), so a
    guard made before the port is bound (``--rp_api_port 0``) has no window without it.

    Example::

        guard = Guard.for_host("localhost")
        guard.check("api_run", "POST", {"host": "localhost:8000"}, 8000)  # Refusal(415...)
    """

    names: frozenset[str]

    @classmethod
    def for_host(cls, api_host: str, allow: tuple[str, ...] = ()) -> Guard:
        """This machine's names, *api_host* (``--rp_api_host``) as given, and the names
        the developer allowed (``--rp_api_allow_host``: a compose service, a proxy)."""
        names = {*LOCAL_NAMES}
        for name in (api_host, *allow):
            named = f"[{name}]" if ":" in name and not name.startswith("[") else name
            names.add(named.lower())
        return cls(frozenset(names))

    def allows_host(self, host: str, port: int | None) -> bool:
        """True if *host* (a Host header) names this machine on *port*.

        A browser leaves out port 80; *port* None (a stream with no socket) takes any.
        """
        name, colon, given = host.lower().rpartition(":")
        if not colon or name.endswith(":") or given.endswith("]"):  # no port, or [::1]
            return host.lower() in self.names and port in (80, None)
        return name in self.names and (port is None or given == str(port))

    def check(
        self, route: str, method: str, headers: Mapping[str, str], port: int | None
    ) -> Refusal | None:
        """The refusal for a request to *route* that arrived on *port*, or None to serve it.

        *headers* are lowercased names, as h11 gives them.
        """
        host = headers.get("host", "")
        if not self.allows_host(host, port):
            return Refusal(403, _unknown_host(host))
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{host.lower()}":
            return Refusal(403, "cross-origin request refused: the endpoint serves its own page")
        site = headers.get("sec-fetch-site")
        if site is not None and site not in _OWN_SITE and not _navigation(route, method, headers):
            return Refusal(403, "cross-origin request refused: the endpoint serves its own page")
        # A GET of /runsync has no body to type: its route answers 405.
        posted = route in BODY_ROUTES and method == "POST"
        if route.startswith("api_") and (posted or _has_body(headers)):
            media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type != "application/json":
                return Refusal(415, "the body must be sent as Content-Type: application/json")
        return None


def _unknown_host(host: str) -> str:
    name = host.rpartition(":")[0] if host.count(":") == 1 else host
    name = "".join(ch for ch in name if ch.isalnum() or ch in ".-_[]:") or "NAME"
    return (
        f"Host {host!r} is not this machine's address for this endpoint; to serve it by that "
        f"name (a docker-compose service, a proxy URL), start it with --rp_api_allow_host "
        f"{name} (trio-worker dev --allow-host {name})"
    )


def _navigation(route: str, method: str, headers: Mapping[str, str]) -> bool:
    """A link followed to the page from elsewhere: harmless, and shown unframed only."""
    return (
        route in NAVIGABLE
        and method == "GET"
        and headers.get("sec-fetch-mode") == "navigate"
        and headers.get("sec-fetch-dest", "document") == "document"
    )


def _has_body(headers: Mapping[str, str]) -> bool:
    length = headers.get("content-length", "0").strip()
    return "transfer-encoding" in headers or length not in ("", "0")
