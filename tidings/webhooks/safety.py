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
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable
from urllib.parse import urlsplit

import trio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# (host, port) -> the addresses the name resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]

RESOLVE_TIMEOUT_SECONDS = 5.0
# Names one team may have being resolved at once for its endpoint changes, per
# process. A request resolving holds a place among the requests that need
# storage (and its pooled connection), so a team whose names resolve slowly
# must not be able to take them all.
CHECKS_PER_TEAM = 2


class UnsafeTarget(Exception):
    """The target resolves to an address webhooks may not reach."""


class UnresolvableTarget(Exception):
    """The target's name does not resolve."""


class TooManyChecks(Exception):
    """The team has ``CHECKS_PER_TEAM`` names being resolved already."""


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


# IPv6 prefixes whose last 32 bits are an IPv4 address a gateway will reach:
# IPv4-compatible (deprecated), SIIT-translated, NAT64 (well-known and local-use).
_EMBEDDING_IPV4 = tuple(
    ipaddress.IPv6Network(prefix)
    for prefix in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)
# Not global, whatever the Python version's tables say.
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(prefix)
    for prefix in ("192.0.0.0/24", "198.18.0.0/15", "100.64.0.0/10", "fec0::/10", "fc00::/7")
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, if it is one of the forms that carry one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address.is_unspecified or address.is_loopback:
        return None
    if any(address in network for network in _EMBEDDING_IPV4):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def forbidden_kind(address: IPAddress) -> str | None:
    """Why webhooks may not reach ``address``, or None when they may."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            return forbidden_kind(inner)
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private or any(address in network for network in _NOT_PUBLIC):
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

    def __init__(
        self, *, allow_private: bool, resolve: Resolver = system_resolve,
        checks_per_team: int = CHECKS_PER_TEAM,
    ) -> None:
        self.allow_private = allow_private
        self._resolve = resolve
        self.checks_per_team = checks_per_team
        # Names being resolved by check_url, by team.
        self._checking: Counter[Hashable] = Counter()

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
        except (OSError, UnicodeError, trio.TooSlowError) as error:
            raise UnresolvableTarget(f"{host} does not resolve ({error})") from None
        if not found:
            raise UnresolvableTarget(f"{host} does not resolve")
        return self.vet(host, found)

    async def check_url(self, url: str, team: Hashable | None = None) -> None:
        """Refuse a URL whose host is a forbidden address now (UnsafeTarget).

        A name that does not resolve today (or not within
        ``RESOLVE_TIMEOUT_SECONDS``) is accepted: it is checked again at every
        delivery. A name to resolve while ``team`` already has
        ``checks_per_team`` being resolved raises TooManyChecks at once; an
        address literal is vetted without resolving, so it never does.
        """
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if literal_address(host) is None and team is not None:
            if self._checking[team] >= self.checks_per_team:
                raise TooManyChecks(
                    f"{self.checks_per_team} webhook URLs of this team are being checked"
                )
            self._checking[team] += 1
        else:
            team = None
        try:
            await self.addresses(host, port)
        except UnresolvableTarget:
            pass
        finally:
            if team is not None:
                self._checking[team] -= 1
                if not self._checking[team]:
                    del self._checking[team]
