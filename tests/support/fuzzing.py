"""Schemathesis generation spread over worker processes, for ``tests/test_fuzz_http.py``.

Generating a case is hypothesis drawing a JSON body from the operation's schema: about
10-40 ms of CPU per case, against a few ms for the server to answer it. One generator
process is therefore the bottleneck of the run, so :func:`run` starts several plain
(pytest-less) processes that each take :class:`Task` chunks from a shared queue, generate
their cases with hypothesis and send them to the same server over one keep-alive
connection. What a process sends is counted per operation and returned, so the test
asserts on requests that were really answered.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

CHUNK = 125  # most cases one task generates; the bigger quotas become several tasks


@dataclass(frozen=True)
class Task:
    """Generate up to ``examples`` cases of one operation with one hypothesis seed; with
    ``name``, the path parameter ``name`` is that value instead of one drawn from the schema."""

    method: str
    path: str
    examples: int
    seed: int
    name: str | None = None

    @property
    def key(self) -> str:
        """``"METHOD path"``, plus ``[name=…]`` for a fixed name."""
        label = f"{self.method.upper()} {self.path}"
        return label if self.name is None else f"{label} [name={self.name!r}]"


@dataclass
class Outcome:
    """What the workers sent and what came back."""

    sent: Counter[str] = field(default_factory=Counter)  # answered requests per operation
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # "METHOD path -> 5xx body"
    transport_errors: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)  # a worker's own exception
    cpu_seconds: float = 0.0  # CPU the workers spent on the tasks

    def add(self, other: Outcome) -> None:
        self.sent.update(other.sent)
        self.statuses.update(other.statuses)
        self.server_errors += other.server_errors
        self.transport_errors += other.transport_errors
        self.crashes += other.crashes
        self.cpu_seconds += other.cpu_seconds

    @property
    def total(self) -> int:
        return sum(self.sent.values())


def plan(document: dict[str, Any], quota: dict[str, int], seed: int) -> list[Task]:
    """Tasks covering every operation of ``document``: ``quota[key]`` cases each (by
    ``"METHOD path"``), cut into chunks of :data:`CHUNK` with distinct seeds; the biggest
    chunks first so the last ones to finish are short."""
    tasks: list[Task] = []
    for path, item in document["paths"].items():
        for method in item:
            remaining = quota[f"{method.upper()} {path}"]
            while remaining > 0:
                examples = min(CHUNK, remaining)
                tasks.append(Task(method, path, examples, seed + len(tasks)))
                remaining -= examples
    return sorted(tasks, key=lambda t: -t.examples)


def run(document: dict[str, Any], base_url: str, tasks: list[Task], workers: int, timeout: float) -> Outcome:
    """Run ``tasks`` in ``workers`` fresh processes against ``base_url``; raises
    ``multiprocessing.TimeoutError`` when they are not done within ``timeout`` seconds."""
    from hypothesis import strategies as st

    # Hypothesis works out which characters UTF-8 can encode once per checkout (seconds of
    # CPU) and caches it in .hypothesis/: done here, before the workers, so that a fresh
    # clone does not have every worker compute it at once.
    st.characters(codec="utf-8").validate()
    outcome = Outcome()
    # spawn, not fork: the parent runs threads (pytest plugins, httpx), and a forked
    # child would inherit their locks.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_worker, initargs=(document, base_url)) as pool:
        pending = pool.map_async(_run_task, tasks, chunksize=1)
        for part in pending.get(timeout):
            outcome.add(part)
    return outcome


# --- inside a worker process -------------------------------------------------------------

_worker: dict[str, Any] = {}


def _start_worker(document: dict[str, Any], base_url: str) -> None:
    import requests
    import schemathesis

    schema = schemathesis.openapi.from_dict(document)
    _worker["operations"] = {f"{o.method.upper()} {o.path}": o for o in (r.ok() for r in schema.get_all_operations())}
    _worker["base_url"] = base_url
    session = requests.Session()
    session.trust_env = False  # no proxy look-up in the environment on every request
    _worker["session"] = session


def _run_task(task: Task) -> Outcome:
    started = time.process_time()
    try:
        outcome = _generate_and_send(task)
    except Exception:  # noqa: BLE001 - reported to the test, which fails on it
        outcome = Outcome(crashes=[f"{task.key}: {traceback.format_exc()}"])
    outcome.cpu_seconds = time.process_time() - started
    return outcome


def _generate_and_send(task: Task) -> Outcome:
    import requests
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

    operation = _worker["operations"][f"{task.method.upper()} {task.path}"]
    session: requests.Session = _worker["session"]
    base_url: str = _worker["base_url"]
    outcome = Outcome()

    # Generation only: a passing run has nothing to shrink, the example database would
    # only replay old cases, and the health checks judge a generator that is meant to
    # be slow (large bodies) or to exhaust small input spaces (seven names).
    @seed(task.seed)
    @settings(
        max_examples=task.examples,
        phases=[Phase.generate],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(case=operation.as_strategy(path_parameters=None if task.name is None else {"name": task.name}))
    def send(case: Any) -> None:
        try:
            response = session.request(**case.as_transport_kwargs(base_url=base_url), timeout=30)
        except requests.RequestException as exc:
            outcome.transport_errors.append(f"{case.method} {case.formatted_path}: {exc!r}")
            return
        outcome.sent[task.key] += 1
        outcome.statuses[response.status_code] += 1
        if response.status_code >= 500:
            outcome.server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code} {response.text[:200]}")

    send()
    return outcome
