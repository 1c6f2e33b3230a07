"""Sending clusters of entries to the ``refine_cluster`` model task (reflections and persona
both refine their entries; the outcome comes back as :class:`RefineDone`)."""

from __future__ import annotations

from collections.abc import Mapping

from nekomem.actors.messages import RefineDone
from nekomem.actors.ports import LayerPorts
from nekomem.domain.prompts import longterm as prompts


def send_refine_clusters(ports: LayerPorts, clusters: list[tuple[dict[str, str], Mapping[str, object]]], what: str) -> int:
    """Ask ``refine_cluster`` for each (member id -> text, extra context) until the pool
    refuses; each answer comes back to the layer as a :class:`RefineDone`. Returns how many
    were sent (the caller counts them as in flight)."""
    sent = 0
    timeout = ports.settings.longterm.longterm_refine_timeout_seconds
    for members, extra in clusters:
        messages = prompts.refine_cluster_messages(list(members.items()), **ports.names())

        def done(
            token: int, output: object, error: str | None, members: dict[str, str] = members, extra: Mapping[str, object] = extra
        ) -> RefineDone:
            return RefineDone(token=token, output=output, error=error, members=members, extra=extra)

        if ports.ask_model("refine_cluster", messages, done, timeout=timeout) is None:
            break
        sent += 1
    if clusters:
        ports.log.info("%s refinement: %d of %d clusters sent", what, sent, len(clusters))
    return sent
