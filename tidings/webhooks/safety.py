"""Refusing webhook targets inside the network Tidings runs in (SSRF).

A URL is checked twice: when an endpoint is created or changed, and at
every connection, where the name is resolved once, each address is vetted,
and the connection goes to a vetted address. A name that resolved to a
public address at creation and to 127.0.0.1 later (DNS rebinding) is caught
at delivery, because the address connected to is the address checked.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

import httpcore
import trio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# (host, port) -> the addresses the name resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]

RESOLVE_TIMEOUT_SECONDS = 5.0

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


class UnsafeTarget(Exception):
    """The target resolves to an address webhooks may not reach."""


class UnresolvableTarget(Exception):
    """The target's name does not resolve."""


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def forbidden_kind(address: IPAddress) -> str | None:
    """Why webhooks may not reach ``address``, or None when they may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "reserved"
    return None


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class Guard:
    """Resolves target names and refuses the addresses webhooks may not reach."""

    def __init__(self, *, allow_private: bool, resolve: Resolver = system_resolve) -> None:
        self.allow_private = allow_private
        self._resolve = resolve

    def vet(self, host: str, addresses: Iterable[str]) -> list[str]:
        vetted = []
        for text in addresses:
            kind = forbidden_kind(ipaddress.ip_address(text.split("%", 1)[0]))
            if kind is not None and not self.allow_private:
                if host == text:
                    raise UnsafeTarget(f"{host} is a {kind} address")
                raise UnsafeTarget(f"{host} resolves to {text}, a {kind} address")
            vetted.append(text)
        return vetted

    async def addresses(self, host: str, port: int) -> list[str]:
        """The vetted addresses of ``host``; raises UnsafeTarget or UnresolvableTarget.

        One forbidden address among several refuses the whole name: an
        attacker controls which of its records a resolver returns first.
        """
        literal = literal_address(host)
        if literal is not None:
            return self.vet(str(literal), [str(literal)])
        try:
            with trio.fail_after(RESOLVE_TIMEOUT_SECONDS):
                found = await self._resolve(host, port)
        except (OSError, trio.TooSlowError) as error:
            raise UnresolvableTarget(f"{host} does not resolve ({error})") from None
        if not found:
            raise UnresolvableTarget(f"{host} does not resolve")
        return self.vet(host, found)

    async def check_url(self, url: str) -> None:
        """Refuse a URL whose host is a forbidden address now (UnsafeTarget).

        A name that does not resolve today is accepted: it is checked again
        at every delivery.
        """
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            await self.addresses(host, port)
        except UnresolvableTarget:
            pass


class GuardedBackend(httpcore.TrioBackend):
    """httpcore's trio network backend, connecting only to vetted addresses."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self._guard.addresses(host, port)
        except (UnsafeTarget, UnresolvableTarget) as refused:
            raise httpcore.ConnectError(str(refused)) from None
        last: Exception | None = None
        for address in addresses:
            try:
                return await super().connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                last = error
        assert last is not None
        raise last
