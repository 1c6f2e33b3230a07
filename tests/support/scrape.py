"""Scrape a live server's ``/metrics`` and read series out of it with prometheus_client's
own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.live import LiveServer

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(srv: LiveServer, **kwargs: Any) -> tuple[str, Samples]:
    """(exposition text, samples by sample name) of one ``GET /metrics``."""
    r = srv.get("/metrics", **kwargs)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return r.text, samples


def matching(samples: Samples, name: str, **labels: str) -> list[float]:
    """Values of every series ``name`` whose labels include ``labels``."""
    return [value for got, value in samples.get(name, []) if all(got.get(k) == v for k, v in labels.items())]


def one(samples: Samples, name: str, **labels: str) -> float:
    """The value of the single series ``name{labels}`` (fails when absent or ambiguous)."""
    values = matching(samples, name, **labels)
    assert len(values) == 1, f"{name}{labels}: {values}"
    return values[0]
