"""Command line: ``nekomem serve``, ``nekomem settings``, ``nekomem import-neko`` and ``nekomem mcp``."""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from nekomem import cluster_cli
from nekomem.config import SettingsError, load_settings, settings_markdown


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nekomem", description="Local memory server for AI companion characters.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, env NEKOMEM_HOST)")
    serve.add_argument("--port", type=int, help="port (default 48912, env NEKOMEM_PORT)")
    serve.add_argument("--memory-root", help="data folder (default ./memory, env NEKOMEM_MEMORY_ROOT)")
    serve.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    sub.add_parser("settings", help="print every setting with its default as Markdown")
    cluster_cli.add_parser(sub)
    imp = sub.add_parser("import-neko", help="import a reference (N.E.K.O.) memory folder into the memory root")
    imp.add_argument("source_dir", help="the reference memory folder (one sub-folder per character) or one character folder")
    imp.add_argument("--memory-root", help="data folder to import into (default: the serve settings)")
    imp.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    imp.add_argument("--character", action="extend", nargs="+", metavar="NAME", help="import only these characters")
    imp.add_argument("--progress", action="store_true", help="draw a progress bar on stderr even when it is not a terminal")
    mcp = sub.add_parser("mcp", help="serve one character's memory as MCP tools over stdio (needs nekomem[mcp] and a running server)")
    mcp.add_argument("--character", required=True, help="the character whose memory the tools use")
    mcp.add_argument("--url", help="the running server (default $NEKOMEM_URL, else the serve settings' host and port)")
    mcp.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG), for the default URL")
    return parser


def server_url(settings) -> str:  # type: ignore[no-untyped-def]
    """The URL a client on this machine reaches the configured server at."""
    host = settings.server.host
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "::" else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{settings.server.port}"


def make_embeddings(settings):  # type: ignore[no-untyped-def]
    """The process-wide embedding service, or None when the optional parts are missing."""
    try:
        from nekomem.recall.embeddings import EmbeddingService
    except ImportError:
        return None
    return EmbeddingService(settings.embeddings)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "settings":
        print(settings_markdown())
        return 0
    overrides: dict[str, object] = {"memory_root": getattr(args, "memory_root", None)}
    if args.command == "serve":
        overrides.update(host=args.host, port=args.port)
    try:
        settings = load_settings(args.config, overrides=overrides)
    except SettingsError as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 2
    if args.command == "cluster":  # a client of a running cluster
        return cluster_cli.run(args, server_url(settings), settings.server.api_token, sys.stdout, sys.stderr)
    if args.command == "mcp":  # a client of a running server: stdout is the MCP stream
        import os

        from nekomem.mcp.stdio import run

        return run(args.character, args.url or os.environ.get("NEKOMEM_URL") or server_url(settings))
    from nekomem.http.guard import bind_refusal

    refusal = bind_refusal(settings.server)
    if refusal is not None:
        print(f"nekomem: {refusal}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, settings.server.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "import-neko":
        from nekomem.importer.command import import_neko

        return import_neko(settings, args.source_dir, args.character, show_progress=args.progress, out=sys.stdout, err=sys.stderr)
    import uvicorn

    from nekomem.http.app import create_app

    app = create_app(settings, embeddings=make_embeddings(settings))
    # What is built by now (modules, settings, the app) lives as long as the process: out
    # of the collector's sight, a full collection no longer walks it on every request burst.
    gc.freeze()
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level.lower(),
        access_log=False,
    )
    return 0
