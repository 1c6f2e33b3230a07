"""A scripted OpenAI-compatible embedding and re-ranking server on 127.0.0.1, for tests.

``FakeEmbeddings`` is a real HTTP server (ThreadingHTTPServer on an ephemeral port, served
from a background thread):

- ``POST /v1/embeddings`` (``{"model", "input": [texts]}``) answers deterministic vectors
  of width ``dim``: each word adds its concept's axis, where the words of one entry of
  ``CONCEPTS`` share an axis ("kitten" and "feline" point the same way) and any other word
  a hashed axis, so similar texts have a high cosine without sharing a word;
- ``POST /v1/rerank`` (``{"query", "documents" | "texts", "top_n"}``) answers the order the
  test scripted with :meth:`FakeEmbeddings.rank_with` (``results: [{index,
  relevance_score}]``, or TEI's bare list with ``score`` when ``shape="tei"``).

:meth:`stop` closes the port (clients get connection refused) and :meth:`start` opens the
same port again; :meth:`hang` makes every request wait until :meth:`release`. Requests are
recorded (:meth:`calls`).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONCEPTS = (
    ("cat", "cats", "kitten", "feline", "kitty"),
    ("cello", "violoncello", "instrument", "music"),
    ("kite", "kites", "glider"),
)
_WORD = re.compile(r"\w+")


def fake_vector(text: str, dim: int, model: str = "") -> list[float]:
    """The deterministic vector of ``text`` (see the module docstring); ``model`` salts the
    hashed axes so two models give different vectors."""
    vec = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        axis = next((i for i, group in enumerate(CONCEPTS) if word in group), None)
        if axis is None:
            digest = hashlib.sha256(f"{model}:{word}".encode()).digest()
            axis = len(CONCEPTS) + digest[0] % (dim - len(CONCEPTS))
        vec[axis] += 1.0
    if not any(vec):
        vec[-1] = 1.0
    return vec


class FakeEmbeddings:
    """See the module docstring."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self.port = 0
        self._lock = threading.Lock()
        self._calls: list[dict[str, Any]] = []
        self._ranker: Callable[[str, list[str]], list[int]] | None = None
        self.rerank_shape = "results"
        self.rerank_status = 200
        self._gate = threading.Event()
        self._gate.set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> FakeEmbeddings:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                owner._gate.wait(60)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner._calls.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                status, answer = owner._answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the port: requests are refused until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeEmbeddings:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting -------------------------------------------------------------------
    def hang(self) -> None:
        """Every request waits (up to 60 s) until :meth:`release`."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def rank_with(self, ranker: Callable[[str, list[str]], list[int]] | None) -> None:
        """``/v1/rerank`` answers ``ranker(query, documents)``: document indexes, best first."""
        self._ranker = ranker

    def calls(self, path: str = "") -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self._calls if not path or c["path"] == path]

    # -- answers ---------------------------------------------------------------------
    def _answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/embeddings":
            texts = body.get("input")
            if isinstance(texts, str):
                texts = [texts]
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                return 400, {"error": "input must be a list of strings"}
            model = str(body.get("model", ""))
            data = [{"object": "embedding", "index": i, "embedding": fake_vector(t, self.dim, model)} for i, t in enumerate(texts)]
            data.reverse()  # the index, not the order, says which text a row is
            return 200, {"object": "list", "data": data, "model": model}
        if path == "/v1/rerank":
            if self.rerank_status != 200 or self._ranker is None:
                return self.rerank_status if self.rerank_status != 200 else 500, {"error": "no ranker"}
            docs = body.get("documents", body.get("texts"))
            order = self._ranker(str(body.get("query", "")), list(docs or []))
            top_n = body.get("top_n") or len(order)
            scored = [(index, 1.0 - rank / (len(order) + 1)) for rank, index in enumerate(order[:top_n])]
            if self.rerank_shape == "tei":
                return 200, [{"index": i, "score": sc} for i, sc in scored]
            return 200, {"results": [{"index": i, "relevance_score": sc} for i, sc in scored]}
        return 404, {"error": "not found"}
