"""A write load for cluster tests: threads posting one turn per request with an
Idempotency-Key, retrying the same key on the answers a client is told to retry (503 / 409
with Retry-After) or on a lost connection, and recording every acknowledged turn and every
error answer."""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import dataclass, field

import httpx


@dataclass
class Load:
    urls: list[str]
    names: list[str]
    acked: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[int, str, str | None]] = field(default_factory=list)  # (status, error_code, Retry-After)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, client: httpx.Client, rng: random.Random, name: str, text: str) -> bool:
        """Post one turn until it is acknowledged (or the load stops), each attempt to a
        random entry point; True when acked."""
        key = uuid.uuid4().hex
        while not self.stop.is_set():
            url = rng.choice(self.urls)
            try:
                r = client.post(
                    f"{url}/cache/{name}", json={"input_history": [{"role": "user", "content": text}]}, headers={"Idempotency-Key": key}
                )
            except httpx.HTTPError:
                continue  # the node died under us: the same key again (maybe elsewhere)
            if r.status_code == 200:
                with self.lock:
                    self.acked.append((name, text))
                return True
            try:
                code = r.json().get("error_code", "")
            except ValueError:
                code = r.text[:80]
            with self.lock:
                self.errors.append((r.status_code, str(code), r.headers.get("retry-after")))
            if r.status_code not in (503, 409):
                return False
        return False

    def worker(self, tag: str, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=30) as client:
            i = 0
            while not self.stop.is_set():
                name = rng.choice(self.names)
                self.post(client, rng, name, f"{tag}-{i}")
                i += 1

    def start(self, threads: int = 4) -> None:
        for t in range(threads):
            thread = threading.Thread(target=self.worker, args=(f"w{t}-{uuid.uuid4().hex[:6]}", t), daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def unexpected_errors(self) -> list[tuple[int, str, str | None]]:
        """Error answers other than 503/409 with Retry-After."""
        return [e for e in self.errors if e[0] not in (503, 409) or not e[2]]
