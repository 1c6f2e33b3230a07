"""The layer tests' FakePorts offer everything a layer may use (the LayerPorts protocol),
so a layer that builds over the real ports builds over the fakes too."""

from __future__ import annotations

import inspect

from nekomem.actors.ports import ActorPorts, LayerPorts
from tests.support.fake_ports import FakePorts


def members(cls: type) -> dict[str, inspect.Signature | None]:
    found: dict[str, inspect.Signature | None] = {}
    for name, value in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        found[name] = inspect.signature(value) if inspect.isfunction(value) else None
    return found


def test_the_fakes_and_the_actor_ports_offer_what_the_protocol_declares() -> None:
    declared = members(LayerPorts)
    assert {"send", "run_job", "ask_model", "deadline", "journal", "settings"} <= set(declared)
    for implementation in (ActorPorts, FakePorts):
        offered = members(implementation)
        missing = sorted(set(declared) - set(offered))
        assert missing == [], (implementation.__name__, missing)
        for name, signature in declared.items():
            if signature is not None:
                assert list(offered[name].parameters) == list(signature.parameters), (implementation.__name__, name)
