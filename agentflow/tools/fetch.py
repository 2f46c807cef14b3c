"""A guarded HTTP GET for the search tools: deadline-bound, retried, size-capped, redirect- and address-checked.

``Fetcher.get(url, deadline, ...)`` returns a ``Fetched`` or raises ``FetchError`` whose ``str`` is a typed tool
error, ``"kind: message"``, with kind one of ``ERROR_KINDS``. Rules:

* every attempt gets the time left on the deadline (or ``timeout_s`` if smaller); none starts once it is spent;
* 429 and 5xx answers, refused connections and dropped connections are retried, at most ``attempts`` times in
  all, after ``backoff_s * 2**n`` seconds or the answer's ``Retry-After`` (never past the deadline);
* a URL that does not parse is an ``invalid_input`` error (``check_url``), never another exception;
* the body is read as a stream and the read stops past ``max_bytes`` (``too_large``);
* redirects are followed by hand, at most ``max_redirects``, http and https only;
* with an ``AddressGuard``, every connection (every redirect hop included) is made to an address the guard
  accepts, checked on the addresses the host name resolves to, at connection time (so a name that resolves
  differently on a second look cannot slip through).
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from agentflow import __version__
from agentflow.domain.deadline import Deadline

USER_AGENT = f"AgentFlow/{__version__} (+https://github.com/agentflow; tools)"
PAGE_TYPES = ("text/html", "text/plain", "application/xhtml+xml")
ERROR_KINDS = ("invalid_input", "unavailable", "timeout", "bad_response", "too_large", "forbidden",
               "unsupported_content", "rate_limited")
REDIRECTS = (301, 302, 303, 307, 308)


class FetchError(Exception):
    """A typed failure; ``str(err)`` is ``"kind: message"``."""

    def __init__(self, kind: str, message: str):
        assert kind in ERROR_KINDS, kind
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    status: int
    content_type: str  # the media type, lower case, no parameters
    charset: str | None
    body: bytes
    headers: dict = field(default_factory=dict)

    def text(self) -> str:
        return self.body.decode(self.charset or "utf-8", errors="replace")

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise FetchError("bad_response", f"{_origin(self.url)} answered with a body that is not JSON") from exc


class AddressGuard:
    """Refuses addresses that are not public: private, loopback, link-local, multicast, reserved, unspecified
    (and the other non-global ranges, e.g. 100.64.0.0/10). ``allow_private`` turns it off; ``allowed_networks``
    lets chosen ranges through (e.g. ``("127.0.0.0/8",)`` for tests against local servers)."""

    def __init__(self, *, allow_private: bool = False, allowed_networks: tuple[str, ...] | list[str] = ()):
        self.allow_private = allow_private
        self.allowed_networks = tuple(ipaddress.ip_network(n, strict=False) for n in allowed_networks)

    def refusal(self, address: str) -> str | None:
        """Why ``address`` (an IP literal) is refused, or None when it is accepted."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if self.allow_private or any(ip.version == n.version and ip in n for n in self.allowed_networks):
            return None
        for name in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
            if getattr(ip, f"is_{name}"):
                return name.replace("_", "-")
        return None if ip.is_global else "not globally routable"

    def resolve(self, host: str, port: int) -> list[str]:
        """The addresses ``host`` resolves to; FetchError("forbidden") if any of them is refused."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise FetchError("unavailable", f"cannot resolve {host!r}: {exc}") from exc
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        for address in addresses:
            reason = self.refusal(address)
            if reason:
                raise FetchError("forbidden", f"{host} resolves to {address.split('%')[0]}, a {reason} address")
        return addresses


class _GuardedBackend(httpcore.SyncBackend):
    """Connects only to addresses the guard accepts, to the very address it checked."""

    def __init__(self, guard: AddressGuard):
        self.guard = guard

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        addresses = self.guard.resolve(host, port)
        last: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                last = exc
        raise last or httpcore.ConnectError(f"no address for {host}")


def _transport(guard: AddressGuard | None, trust_env: bool) -> httpx.HTTPTransport:
    transport = httpx.HTTPTransport(trust_env=trust_env)
    if guard is not None:  # httpx has no public hook for the network backend; the pool takes one
        pool = transport._pool
        if not hasattr(pool, "_network_backend"):
            raise RuntimeError("this httpcore version has no network backend hook; the address guard needs it")
        pool._network_backend = _GuardedBackend(guard)
    return transport


class Fetcher:
    """One client per tool (thread-safe). ``guard=None`` fetches from any address (configured endpoints)."""

    def __init__(self, *, user_agent: str = "", attempts: int = 3, backoff_s: float = 0.5, max_redirects: int = 5,
                 guard: AddressGuard | None = None):
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_redirects = max_redirects
        self.guard = guard
        # a proxy would be the only address the guard sees: guarded fetches ignore proxy variables
        self._client = httpx.Client(transport=_transport(guard, trust_env=guard is None), follow_redirects=False,
                                    headers={"User-Agent": user_agent or USER_AGENT}, trust_env=guard is None)

    def close(self) -> None:
        self._client.close()

    def get(self, url: str, deadline: Deadline, *, params: dict | None = None, headers: dict | None = None,
            max_bytes: int = 2_000_000, content_types: tuple[str, ...] = (), timeout_s: float | None = None
            ) -> Fetched:
        """GET ``url``: the final 2xx answer, or FetchError. ``content_types`` (media types) empty: any."""
        for _hop in range(self.max_redirects + 1):
            check_url(url)
            response = self._attempts(url, deadline, params, headers, max_bytes, timeout_s)
            if response.status not in REDIRECTS:
                return _accept(response, content_types)
            location = response.headers.get("location")
            if not location:
                raise FetchError("bad_response", f"{_origin(url)} redirected (HTTP {response.status}) without "
                                                 f"a Location")
            url, params = urljoin(url, location), None
        raise FetchError("bad_response", f"more than {self.max_redirects} redirects, last to {_origin(url)}")

    def _attempts(self, url, deadline, params, headers, max_bytes, timeout_s) -> Fetched:
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._once(url, deadline, params, headers, max_bytes, timeout_s)
            except _Retryable as exc:
                last = exc.error
                wait = self.backoff_s * 2 ** (attempt - 1)
            else:
                if response.status != 429 and response.status < 500:
                    return response
                last = _status_error(url, response.status)
                wait = _retry_after(response.headers.get("retry-after"), self.backoff_s * 2 ** (attempt - 1))
            if attempt == self.attempts or wait >= deadline.remaining():
                raise last
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _once(self, url, deadline, params, headers, max_bytes, timeout_s) -> Fetched:
        limit = deadline.cap(timeout_s)
        if limit <= 0:
            raise FetchError("timeout", f"no time left for {_origin(url)}")
        try:
            with self._client.stream("GET", url, params=params, headers=headers, timeout=limit) as response:
                if response.status_code in REDIRECTS or response.status_code == 429 or response.status_code >= 500:
                    return _fetched(response, b"")
                return _fetched(response, _read_capped(response, url, max_bytes, deadline))
        except httpx.TimeoutException as exc:
            raise FetchError("timeout", f"{_origin(url)} did not answer within {limit:.3g} s") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise _Retryable(FetchError("unavailable", f"{_origin(url)}: {type(exc).__name__}: {exc}")) from exc
        except httpx.HTTPError as exc:
            raise FetchError("unavailable", f"{_origin(url)}: {type(exc).__name__}: {exc}") from exc


class _Retryable(Exception):
    def __init__(self, error: FetchError):
        self.error = error


def _read_capped(response: httpx.Response, url: str, max_bytes: int, deadline: Deadline) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise FetchError("too_large", f"{_origin(url)} sent {int(declared)} bytes, over the {max_bytes}-byte cap")
    chunks, size = [], 0
    for chunk in response.iter_bytes():  # decoded bytes: a compressed bomb stops at the cap too
        size += len(chunk)
        if size > max_bytes:
            raise FetchError("too_large", f"{_origin(url)} sent more than the {max_bytes}-byte cap")
        if deadline.expired():
            raise FetchError("timeout", f"{_origin(url)} was still sending when the time ran out")
        chunks.append(chunk)
    return b"".join(chunks)


def _fetched(response: httpx.Response, body: bytes) -> Fetched:
    media, _, rest = response.headers.get("content-type", "").partition(";")
    charset = None
    for part in rest.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            charset = value.strip('"').lower()
    return Fetched(str(response.url), response.status_code, media.strip().lower(), charset, body,
                   dict(response.headers))


def _accept(response: Fetched, content_types: tuple[str, ...]) -> Fetched:
    if not 200 <= response.status < 300:
        raise _status_error(response.url, response.status)
    if content_types and response.content_type not in content_types:
        raise FetchError("unsupported_content", f"{_origin(response.url)} sent {response.content_type or 'no type'}"
                                                f", expected one of {', '.join(content_types)}")
    return response


def _status_error(url: str, status: int) -> FetchError:
    if status == 429:
        return FetchError("rate_limited", f"{_origin(url)} answered HTTP 429 (too many requests)")
    if status >= 500:
        return FetchError("unavailable", f"{_origin(url)} answered HTTP {status}")
    return FetchError("bad_response", f"{_origin(url)} answered HTTP {status}")


def _retry_after(value: str | None, default: float) -> float:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return default
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def check_url(url) -> str:
    """``url`` if it is a well-formed http(s) URL with a host. FetchError otherwise: ``invalid_input`` for one that
    does not parse (not a string; a space, control or line-break character; a bad IPv6 literal, port or host name),
    ``forbidden`` for another scheme or no host."""
    if not isinstance(url, str):
        raise FetchError("invalid_input", f"malformed URL {url!r}: not a string")
    if not url.isprintable() or any(c.isspace() for c in url):
        raise FetchError("invalid_input", f"malformed URL {url[:80]!r}: a space, control or line-break character")
    try:
        parts = urlsplit(url)
        parts.port  # raises on a port that is not a number from 0 to 65535
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise FetchError("invalid_input", f"malformed URL {url[:80]!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("forbidden", f"only http and https URLs are fetched, not {url[:80]!r}")
    return url


def _origin(url: str) -> str:
    """scheme://host[:port] of ``url``: what errors name (never a query string, which may carry a secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts.netloc else url[:80]
