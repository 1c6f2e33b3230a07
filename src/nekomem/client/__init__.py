"""nekomem's Python client: :class:`AsyncNekomemClient` (httpx) and its blocking facade
:class:`NekomemClient`, typed with the server's own msgspec types.

It is a leaf: it imports only the wire types (:mod:`nekomem.http.schemas`), never the
actors or the runtime, so a chat server can use it without the server's dependencies
beyond httpx, anyio and msgspec (``tests/test_layering.py`` checks it).
"""

from nekomem.client.aio import AsyncNekomemClient, retry_after_seconds
from nekomem.client.errors import NekomemError
from nekomem.client.sync import NekomemClient
from nekomem.http.schemas import FactImport

__all__ = ["AsyncNekomemClient", "FactImport", "NekomemClient", "NekomemError", "retry_after_seconds"]
