"""A scripted *ideal extractor*: an OpenAI-compatible model server that answers nekomem's
fact extraction with a LoCoMo conversation's gold observations.

It is the loopback FakeLLM of the tests (real HTTP on 127.0.0.1, every other task answered
by its cooperative defaults) with two tasks scripted:

- ``extract_facts`` (path A) answers the observations about the *user* (speaker A) that
  cite a turn found in the prompt's conversation;
- ``extract_self_disclosure`` (path B) answers the observations about the *AI* (speaker B)
  that cite a turn found in the prompt.

A turn is found when a conversation line of the prompt (``speaker | text``) carries exactly
that turn's text; only the current conversation's turns are known. Turns can be made to
fail: a prompt that holds one is answered with HTTP 500, so its turns stay unmined. Every observation
offered is remembered (:attr:`IdealExtractor.offered`), so a bench can tell which gold
observations the pipeline never showed to the model.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tests.support.fake_llm import FakeLLM, last_user_text

PATH_OF_SPEAKER = {"a": "extract_facts", "b": "extract_self_disclosure"}


@dataclass(frozen=True)
class Observation:
    """One gold observation: about speaker ``who`` ("a" user, "b" AI), citing ``dia_ids``."""

    index: int
    who: str
    text: str
    dia_ids: frozenset[str]
    when: str | None


def _flat(text: str) -> str:
    return " ".join(text.split())


class IdealExtractor:
    """The server and the conversation it currently answers for (see the module docstring)."""

    def __init__(self) -> None:
        self.fake = FakeLLM(model="ideal-extractor")
        self._lock = threading.Lock()
        self._turns: dict[str, set[str]] = {}  # flattened turn text -> dia_ids
        self._by_dia: dict[str, list[Observation]] = defaultdict(list)
        self.observations: list[Observation] = []
        self.offered: set[int] = set()
        self.failing: frozenset[str] = frozenset()  # dia_ids whose extraction fails (HTTP 500)
        self._baseline: dict[str, int] = {}
        self.fake.on("extract_facts", lambda req: self._answer(req, "a"))
        self.fake.on("extract_self_disclosure", lambda req: self._answer(req, "b"))

    def __enter__(self) -> IdealExtractor:
        self.fake.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.close()

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def load(self, turns: list[tuple[str, str]], observations: list[Observation], failing: frozenset[str] = frozenset()) -> None:
        """Answer for one conversation from now on: its ``(dia_id, text)`` turns and its
        gold observations; a prompt that holds a turn of ``failing`` is answered with HTTP
        500 (an extraction that fails, so its turns stay unmined). The offered set and the
        call tally start again."""
        with self._lock:
            self.failing = frozenset(failing)
            self._turns = defaultdict(set)
            for dia_id, text in turns:
                self._turns[_flat(text)].add(dia_id)
            self._by_dia = defaultdict(list)
            for obs in observations:
                for dia_id in obs.dia_ids:
                    self._by_dia[dia_id].append(obs)
            self.observations = list(observations)
            self.offered = set()
        self._baseline = self.fake.tally()

    def tally(self) -> dict[str, int]:
        """Model calls per task since :meth:`load`."""
        now = self.fake.tally()
        return {task: n - self._baseline.get(task, 0) for task, n in sorted(now.items()) if n > self._baseline.get(task, 0)}

    def _answer(self, request: dict[str, Any], who: str) -> dict[str, Any]:
        found: set[str] = set()
        with self._lock:
            for line in last_user_text(request).splitlines():
                _speaker, sep, text = line.partition(" | ")
                if sep:
                    found |= self._turns.get(_flat(text), set())
            if found & self.failing:
                raise RuntimeError("scripted extraction failure")  # FakeLLM answers 500
            chosen: dict[int, Observation] = {}
            for dia_id in found:
                for obs in self._by_dia.get(dia_id, ()):
                    if obs.who == who:
                        chosen[obs.index] = obs
            self.offered |= set(chosen)
        entity = "master" if who == "a" else "neko"
        facts = [
            {"text": o.text, "importance": 5, "entity": entity, "event_start_at": o.when}
            for o in sorted(chosen.values(), key=lambda o: o.index)
        ]
        return {"facts": facts}
