"""The request guard in front of every route: Host, Origin, token and Content-Type.

nekomem holds private conversations and listens on loopback, so the threat is a web page
in the user's own browser. The guard refuses, in this order:

1. a ``Host`` that is not a loopback name, the configured bind host or one of
   ``allowed_hosts`` (403 ``host_not_allowed``): a page that rebinds its domain to
   127.0.0.1 still sends its own domain as Host (DNS rebinding);
2. an ``Origin`` that is neither the server's own origin nor on ``allowed_origins``
   (403 ``origin_not_allowed``): browsers send Origin on every cross-origin write and
   on cross-origin reads by ``fetch``;
3. with ``api_token`` set, a request to anything but an open path (``/health``, and GETs
   of the memory browser's static files under ``/ui``) without
   ``Authorization: Bearer <token>`` (401 ``unauthorized``);
4. a write (POST, PUT, PATCH, DELETE) that carries a body whose ``Content-Type`` is not
   ``application/json`` (415 ``unsupported_media_type``): the content types a browser may
   send cross-origin without a preflight (text/plain, form encodings, none) never reach a
   handler. A write without a body (``/reflect``) needs no Content-Type. The one
   exception is ``/internal/knowledge/packs/import`` (:data:`FORM_PATHS`), which also
   takes ``multipart/form-data``: N.E.K.O.'s chat server forwards the browser's pack upload
   there as it came. The Origin check (2) and the token (3) still apply to it, and a
   browser sends Origin with every cross-origin form post.

The guard is generic ASGI middleware: every route mounted on the app, now or later (the
/ui pages), passes through it.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from nekomem.config.server import ServerSettings
from nekomem.http.errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_MEDIA_TYPE = "application/json"
OPEN_PATHS = frozenset({"/health"})
# Write routes that also accept a multipart upload (see 4. in the module docstring).
FORM_PATHS = frozenset({"/internal/knowledge/packs/import"})
FORM_MEDIA_TYPE = "multipart/form-data"
# The memory browser's static files hold no memory, and a browser cannot attach a bearer
# token to a page load: they are served without one (GET only); the page then asks for
# the token and sends it with every API call.
OPEN_PAGE_PREFIX = "/ui"


def split_host(value: str) -> str:
    """The host name of a ``Host`` header value, lower-case, without port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """True for loopback names and addresses (``localhost``, ``*.localhost``, 127/8, ::1)."""
    host = split_host(host)
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def bind_refusal(settings: ServerSettings) -> str | None:
    """Why the server must not start with these settings, or None when it may.

    Binding to anything but loopback exposes every character's memory to the network, so
    it needs a token (``NEKOMEM_API_TOKEN`` / setting ``api_token``).
    """
    if is_loopback(settings.host) or settings.api_token:
        return None
    return (
        f"refusing to bind to {settings.host!r} without a token: set NEKOMEM_API_TOKEN (setting api_token) "
        "so that every request must carry 'Authorization: Bearer <token>', or bind to 127.0.0.1"
    )


class HostPolicy:
    """Which Host header values and Origins are served."""

    def __init__(self, settings: ServerSettings) -> None:
        bind = split_host(settings.host)
        self.hosts = {split_host(h) for h in settings.allowed_hosts}
        if bind not in WILDCARD_BINDS:
            self.hosts.add(bind)
        # Bound to every interface (only possible with a token): the machine is reached by
        # its addresses, and an IP literal cannot be rebound to another site.
        self.any_ip = bind in WILDCARD_BINDS
        self.origins = {o.strip().rstrip("/").lower() for o in settings.allowed_origins}

    def host_allowed(self, host: str) -> bool:
        name = split_host(host)
        if is_loopback(name) or name in self.hosts:
            return True
        return self.any_ip and _ip(name) is not None

    def origin_allowed(self, origin: str, host: str, scheme: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if origin in self.origins:
            return True
        # The server's own pages (same origin) may call it.
        return bool(host) and origin == f"{scheme}://{host.strip().lower()}"


# The request headers the guard reads (ASGI gives header names in lower case).
_WANTED = frozenset({b"host", b"origin", b"authorization", b"content-type", b"content-length", b"transfer-encoding"})
_HOST_CACHE_MAX = 256


def _guard_headers(scope: Scope) -> dict[str, str]:
    """The headers the guard reads, in one pass over the raw list (the first of each)."""
    found: dict[str, str] = {}
    for key, value in scope["headers"]:
        if key in _WANTED:
            found.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return found


def _has_body(headers: Mapping[str, str]) -> bool:
    if "transfer-encoding" in headers:
        return True
    length = headers.get("content-length")
    if length is None:
        return False
    try:
        return int(length) > 0
    except ValueError:
        return True  # malformed: the body reader answers 400


def _media_type(value: str | None) -> str:
    return "" if value is None else value.split(";", 1)[0].strip().lower()


def json_content_type(value: str | None) -> bool:
    return _media_type(value) == JSON_MEDIA_TYPE


class RequestGuard:
    """ASGI middleware applying the checks of this module to every HTTP and WebSocket request."""

    def __init__(self, app: ASGIApp, settings: ServerSettings, open_paths: Iterable[str] = OPEN_PATHS) -> None:
        self.app = app
        self.policy = HostPolicy(settings)
        self.token = settings.api_token.encode("utf-8")
        self.open_paths = frozenset(open_paths)
        self._hosts: dict[str, bool] = {}  # Host header value -> allowed (the policy is fixed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message, headers = refusal
        response = error_response(status, code, message)
        response.headers.update(headers)
        await response(scope, receive, send)

    def check(self, scope: Scope) -> tuple[int, str, str, dict[str, str]] | None:
        """The refusal (status, error code, message, extra headers) of a request, or None."""
        headers = _guard_headers(scope)
        host = headers.get("host", "")
        if host and not self._host_allowed(host):
            return 403, "host_not_allowed", "this server only answers requests addressed to its loopback or configured host name", {}
        origin = headers.get("origin")
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        if origin is not None and not self.policy.origin_allowed(origin, host, scheme):
            return 403, "origin_not_allowed", "requests from web pages of other origins are refused (setting allowed_origins)", {}
        if self.token and not self._open(scope) and not self._authorized(headers):
            return (
                401,
                "unauthorized",
                "this server needs 'Authorization: Bearer <token>' (NEKOMEM_API_TOKEN)",
                {"WWW-Authenticate": "Bearer"},
            )
        if scope["type"] == "http" and scope["method"] in WRITE_METHODS and _has_body(headers):
            content_type = headers.get("content-type")
            form = scope["path"] in FORM_PATHS and _media_type(content_type) == FORM_MEDIA_TYPE
            if not form and not json_content_type(content_type):
                return 415, "unsupported_media_type", "a request body must be sent as 'Content-Type: application/json'", {}
        return None

    def _host_allowed(self, host: str) -> bool:
        """:meth:`HostPolicy.host_allowed`, remembered per Host value (bounded)."""
        allowed = self._hosts.get(host)
        if allowed is None:
            allowed = self.policy.host_allowed(host)
            if len(self._hosts) >= _HOST_CACHE_MAX:
                self._hosts.clear()
            self._hosts[host] = allowed
        return allowed

    def _open(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if path in self.open_paths:
            return True
        page = path == OPEN_PAGE_PREFIX or path.startswith(OPEN_PAGE_PREFIX + "/")
        return page and scope.get("method") in ("GET", "HEAD")

    def _authorized(self, headers: Mapping[str, str]) -> bool:
        return bearer_matches(headers.get("authorization", ""), self.token)


def bearer_matches(authorization: str, token: bytes) -> bool:
    """True when an ``Authorization`` header value (decoded as latin-1) carries ``token``."""
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # The header was decoded as latin-1 (byte for byte): encoding it back gives the
    # bytes the client sent, the UTF-8 of a non-ASCII token included.
    return hmac.compare_digest(credential.strip().encode("latin-1"), token)
