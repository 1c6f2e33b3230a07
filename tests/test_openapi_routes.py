"""``/openapi.json`` describes exactly the routes the app serves: every Starlette route of
``server/app.py`` (the browser's and the MCP mount's included) and nothing else."""

from __future__ import annotations

from starlette.routing import Route

from tests.support.live import LiveServer, make_settings

# Not an OpenAPI operation: MCP streamable HTTP speaks its own protocol on /mcp (see
# docs/API.md "MCP server"), so the document leaves it out on purpose.
NOT_OPENAPI = {"/mcp"}


def served(app) -> set[tuple[str, str]]:
    ops: set[tuple[str, str]] = set()
    for route in app.routes:
        if getattr(route, "path", None) in NOT_OPENAPI:
            continue
        if isinstance(route, Route):
            ops |= {(route.path_format, m.lower()) for m in route.methods or () if m != "HEAD"}
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")
    return ops


def test_the_document_lists_every_route_and_only_those(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        document = srv.get("/openapi.json").json()
        described = {(path, method) for path, methods in document["paths"].items() for method in methods}
        routes = served(srv.app)
    assert routes - described == set(), "routes missing from /openapi.json"
    assert described - routes == set(), "operations in /openapi.json that no route serves"
    assert ("/api/browse/{name}/facts", "get") in described and ("/api/memory/review_config", "post") in described
