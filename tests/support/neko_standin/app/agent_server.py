"""The stand-in's agent server: a ``/health`` answer."""

from __future__ import annotations

from app._http import make_server

SERVICE = "agent"


def build(port: int):
    return make_server(SERVICE, port)
