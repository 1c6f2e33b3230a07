"""Command line: ``nekomem serve``, ``nekomem settings``, ``nekomem import-neko``, ``nekomem export-neko``,
``nekomem mcp``, ``nekomem neko``, ``nekomem status`` (in cli/status.py) and ``nekomem characters``
(in cli/characters.py)."""

from __future__ import annotations

import argparse
import gc
import sys

import nekomem
from nekomem.cli import status as cli_status
from nekomem.cli.banner import print_banner
from nekomem.cluster import cli as cluster_cli
from nekomem.config import SettingsError, load_settings, settings_markdown
from nekomem.config.server import url_of
from nekomem.domain.layers import layer_settings
from nekomem.server.model_services import make_embeddings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# What the optional ``mcp`` extra brings (the SDK and the pydantic it builds its tools on).
MCP_PACKAGES = ("mcp", "pydantic", "pydantic_core")


def missing_extra(extra: str, what: str) -> str:
    """The one line that says an optional extra is missing and how to install it (nekomem is
    installed from its folder, not from a package registry)."""
    return f"{what} needs the optional '{extra}' extra, which is not installed: run pip install '.[{extra}]' in the nekomem folder"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nekomem", description="Local memory server for AI companion characters.")
    parser.add_argument("--version", action="version", version=f"nekomem {nekomem.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, env NEKOMEM_HOST)")
    serve.add_argument("--port", type=int, help="port (default 48912, env NEKOMEM_PORT)")
    serve.add_argument("--memory-root", help="data folder (default ./memory, env NEKOMEM_MEMORY_ROOT)")
    serve.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    serve.add_argument(
        "--enable-shutdown", action="store_true", default=None, help="POST /shutdown stops the server (setting shutdown_enabled)"
    )
    serve.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="log level (default INFO, env NEKOMEM_LOG_LEVEL)")
    sub.add_parser("settings", help="print every setting with its default as Markdown")
    from nekomem.cli.neko_launch import add_parser as add_neko

    add_neko(sub)
    cluster_cli.add_parser(sub)
    imp = sub.add_parser("import-neko", help="import a reference (N.E.K.O.) memory folder into the memory root")
    imp.add_argument("source_dir", help="the reference memory folder (one sub-folder per character) or one character folder")
    imp.add_argument("--memory-root", help="data folder to import into (default: the serve settings)")
    imp.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    imp.add_argument("--character", action="extend", nargs="+", metavar="NAME", help="import only these characters")
    imp.add_argument("--progress", action="store_true", help="draw a progress bar on stderr even when it is not a terminal")
    exp = sub.add_parser("export-neko", help="write the memory root out as a reference (N.E.K.O.) memory folder")
    exp.add_argument("target_dir", help="the folder to write (one sub-folder per character; existing character folders are refused)")
    exp.add_argument("--memory-root", help="data folder to export (default: the serve settings)")
    exp.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    exp.add_argument("--character", action="extend", nargs="+", metavar="NAME", help="export only these characters")
    exp.add_argument("--timezone", help="IANA zone of the naive local times written (default: import_source_timezone)")
    mcp = sub.add_parser(
        "mcp", help="serve one character's memory as MCP tools over stdio (needs the mcp extra, pip install '.[mcp]', and a running server)"
    )
    mcp.add_argument("--character", required=True, help="the character whose memory the tools use")
    mcp.add_argument("--url", help="the running server (default $NEKOMEM_URL, else the serve settings' host and port)")
    mcp.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG), for the default URL")
    cli_status.add_parser(sub)
    from nekomem.cli import data as cli_data

    cli_data.add_parsers(sub)
    from nekomem.cli import characters as cli_characters

    cli_characters.add_parser(sub)
    return parser


def server_url(settings) -> str:  # type: ignore[no-untyped-def]
    """The URL a client on this machine reaches the configured server at."""
    return url_of(settings.server.host, settings.server.port)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "settings":
        print(settings_markdown(layer_settings()))
        return 0
    if args.command == "neko":
        from nekomem.cli.neko_launch import main as neko_main

        return neko_main(args)
    if args.command == "neko-serve":
        from nekomem.cli.neko_launch import serve_main

        return serve_main(args)
    overrides: dict[str, object] = {"memory_root": getattr(args, "memory_root", None)}
    if args.command == "serve":
        overrides.update(host=args.host, port=args.port, shutdown_enabled=args.enable_shutdown, log_level=args.log_level)
    try:
        settings = load_settings(args.config, overrides=overrides, layers=layer_settings())
    except SettingsError as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 2
    if args.command == "cluster" and args.cluster_command == "shard-root":  # offline, on the folder
        return cluster_cli.shard_root(settings, args.dry_run, sys.stdout, sys.stderr)
    if args.command == "cluster":  # a client of a running cluster
        return cluster_cli.run(args, server_url(settings), settings.server.api_token, sys.stdout, sys.stderr)
    from nekomem.cli import data as cli_data

    if args.command in cli_data.COMMANDS:
        return cli_data.run(args, settings, server_url(settings))
    if args.command == "characters":
        from nekomem.cli import characters as cli_characters

        return cli_characters.run(args, settings, server_url(settings))
    import os

    if args.command == "status":
        url = args.url or os.environ.get("NEKOMEM_URL") or server_url(settings)
        return cli_status.run(url, as_json=args.json, timeout=args.timeout, out=sys.stdout, err=sys.stderr)
    if args.command == "mcp":  # a client of a running server: stdout is the MCP stream
        try:
            from nekomem.mcp.stdio import run
        except ImportError as exc:
            if (exc.name or "").split(".")[0] not in MCP_PACKAGES:
                raise
            print(missing_extra("mcp", "nekomem mcp"), file=sys.stderr)
            return 2
        return run(args.character, args.url or os.environ.get("NEKOMEM_URL") or server_url(settings))
    from nekomem.server.serving import startup_refusal

    refusal = startup_refusal(settings)
    if refusal is not None:
        print(f"nekomem: {refusal}", file=sys.stderr)
        return 2
    if args.command == "export-neko":
        from nekomem.importer.neko_export import export_neko

        return export_neko(settings, args.target_dir, args.character, args.timezone, out=sys.stdout, err=sys.stderr)
    if args.command == "import-neko":
        from nekomem.importer.command import import_neko

        return import_neko(settings, args.source_dir, args.character, show_progress=args.progress, out=sys.stdout, err=sys.stderr)
    from nekomem.server.app import create_app
    from nekomem.server.serving import StartupRefused, claim, serve

    embeddings = make_embeddings(settings)
    app = create_app(settings, embeddings=embeddings)
    # The root's lock, then the port: the banner promises only what is already held.
    try:
        sock = claim(app, settings)
    except StartupRefused as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 1
    # The banner (and its warnings) goes to stderr, where the log goes too.
    print_banner(settings, embeddings.state if embeddings is not None else None, sys.stderr)
    # What is built by now (modules, settings, the app) lives as long as the process: out
    # of the collector's sight, a full collection no longer walks it on every request burst.
    gc.freeze()
    serve(app, settings, sock)
    return 0
