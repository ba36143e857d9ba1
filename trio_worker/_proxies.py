"""Which proxy a connection goes through: the one reading of the proxy variables, for
every connection the worker makes, so a ``NO_PROXY`` that sends the platform direct sends
all of them direct. The rules are docs/reference.md's, "Proxies". A proxy URL's
credentials are never written anywhere (:attr:`Proxy.shown`).
"""

from __future__ import annotations

import importlib.util
import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "Proxy",
    "any_proxy_configured",
    "check_proxies",
    "direct",
    "proxy_for",
    "proxy_variables",
]

_SCHEME_VARIABLES = {
    "https": ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"),
    "http": ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"),
}
_ALL_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
SUPPORTED_SCHEMES = ("http", "https", "socks5", "socks5h")
SOCKS_SCHEMES = ("socks5", "socks5h")
SOCKS_INSTALL = "pip install 'trio_worker[socks]'"


@dataclass(frozen=True)
class Proxy:
    """A proxy to go through, and the variable that named it."""

    url: str  # as given (credentials included): for the client, never for a message
    variable: str

    @property
    def shown(self) -> str:
        """The URL with its credentials hidden, for log lines and errors."""
        parts = urlsplit(self.url)
        if parts.username is None and parts.password is None:
            return self.url
        host = parts.netloc.rpartition("@")[2]
        return parts._replace(netloc=f"***@{host}").geturl()

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the proxy itself: what a connection through it dials."""
        parts = urlsplit(self.url)
        default = {"https": 443, "http": 80}.get(parts.scheme.lower(), 1080)
        return parts.hostname or "", parts.port or default


def proxy_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of *environ* these rules read (both cases of each name)."""
    names = (*_ALL_VARIABLES, "NO_PROXY")
    return {
        name: environ[name] for upper in names for name in (upper, upper.lower()) if name in environ
    }


def any_proxy_configured(environ: Mapping[str, str]) -> bool:
    """Whether any proxy variable is set (a worker with none skips every lookup)."""
    return any(environ.get(name) or environ.get(name.lower()) for name in _ALL_VARIABLES)


def proxy_for(url: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy a connection to *url* goes through, or None to connect directly.

    Raises:
        ConfigurationError: the proxy variable's value is not a URL with a host.
    """
    parts = urlsplit(url)
    variables = _SCHEME_VARIABLES.get(parts.scheme.lower())
    if variables is None:
        return None
    found = next(((name, environ[name]) for name in variables if environ.get(name)), None)
    if found is None:
        return None
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    if direct(host, port, environ):
        return None
    name, value = found
    proxy = Proxy(value if "://" in value else f"http://{value}", name)
    try:
        parsed = urlsplit(proxy.url)
        valid = bool(parsed.hostname) and (parsed.port is None or parsed.port > 0)
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ConfigurationError(f"{name} is not a proxy URL with a host: {proxy.shown!r}")
    return proxy


def direct(host: str, port: int, environ: Mapping[str, str]) -> bool:
    """Whether *host* (on *port*) is reached without a proxy: loopback, or in NO_PROXY."""
    host = host.lower().strip("[]").rstrip(".")
    address = _address(host)
    if host == "localhost" or host.endswith(".localhost") or _loopback(address):
        return True
    rule = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    entries = rule.replace(",", " ").lower().split()
    return any(_matches(entry, host, address, port) for entry in entries)


def check_proxies(urls: Iterable[str], environ: Mapping[str, str]) -> None:
    """Refuse to start with a proxy the worker cannot use for one of *urls*.

    Raises:
        ConfigurationError: the proxy's scheme is not supported, or it is a SOCKS proxy
            and the ``socks`` extra is not installed; the message says what to do.
    """
    for url in urls:
        proxy = proxy_for(url, environ)
        if proxy is None:
            continue
        if proxy.scheme not in SUPPORTED_SCHEMES:
            raise ConfigurationError(
                f"{proxy.variable} is a {proxy.scheme}:// proxy ({proxy.shown}), which "
                f"trio_worker cannot use: use an {', '.join(SUPPORTED_SCHEMES[:-1])} or "
                f"{SUPPORTED_SCHEMES[-1]} proxy"
            )
        if proxy.scheme in SOCKS_SCHEMES and importlib.util.find_spec("socksio") is None:
            raise ConfigurationError(
                f"{proxy.variable} is a SOCKS proxy ({proxy.shown}), which needs the socks "
                f"extra: {SOCKS_INSTALL}"
            )


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback


def _matches(
    entry: str, host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None, port: int
) -> bool:
    if entry == "*":
        return True
    entry, wanted_port = _split_port(entry)
    if wanted_port is not None and wanted_port != port:
        return False
    if address is not None:
        try:
            return address in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False  # a name never matches an address
    domain = entry.removeprefix("*").lstrip(".")
    return bool(domain) and (host == domain or host.endswith("." + domain))


def _split_port(entry: str) -> tuple[str, int | None]:
    """``host:port``, ``[v6]:port`` or ``v4:port`` to ``(host, port)``; a bare IPv6
    address or CIDR block keeps its colons."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
        return host, int(port) if port.isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        if port.isdigit():
            return host, int(port)
    return entry, None
