"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests.

``FakeLLM`` is a real HTTP server (ThreadingHTTPServer on an ephemeral port, served from a
background thread). It answers ``POST /v1/chat/completions`` in the OpenAI shape, reading
the task from the ``X-Nekomem-Task`` header. What it answers is scripted per task:

    with FakeLLM() as llm:
        llm.on("extract_facts", lambda req: {"facts": [...]})      # handler: dict or Reply
        llm.queue("summarize_recent", Reply.text("garbage"), Reply.status(500))  # one-shot
        llm.set_delay(None, 0.5)                                     # every task is slow
        ... point the client at llm.base_url ...
        llm.calls("extract_facts")  # recorded requests: {"task", "path", "headers", "body"}

Order of resolution for one request: the task's queue (one reply consumed), else the task's
handler, else the built-in default handler. Every default is deterministic and derived from
the prompt; see ``DEFAULT_HANDLERS``. A handler that raises makes the server answer 500.

Dialects of real servers (``set_dialect``): refuse requests that carry a feature
(``response_format`` type ``json_schema`` / ``json_object``, or the token parameter
``max_completion_tokens`` / ``max_tokens``) with a given reply before any script runs, and
optionally ignore ``response_format`` and wrap every JSON answer in prose:

    llm.set_dialect(refuse={"json_schema": Reply.status(500, "Internal Server Error")})
    llm.set_dialect(wrap_in_prose=True)
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEFAULT_HANDLERS", "FakeLLM", "Reply", "last_user_text", "prompt_text", "request_features"]

CHAT_PATH = "/v1/chat/completions"
TASK_HEADER = "x-nekomem-task"


class Reply:
    """One scripted answer. Build it with the class methods."""

    __slots__ = ("kind", "value", "status_code", "finish_reason", "seconds", "then", "content_type")

    def __init__(
        self,
        kind: str,
        value: Any = None,
        *,
        status_code: int = 200,
        finish_reason: str = "stop",
        seconds: float = 0.0,
        then: Any = None,
        content_type: str = "application/json",
    ) -> None:
        self.kind = kind
        self.value = value
        self.status_code = status_code
        self.finish_reason = finish_reason
        self.seconds = seconds
        self.then = then
        self.content_type = content_type

    @classmethod
    def json(cls, obj: Any, *, finish_reason: str = "stop") -> Reply:
        """A completion whose content is ``obj`` JSON-encoded."""
        return cls("json", obj, finish_reason=finish_reason)

    @classmethod
    def text(cls, content: str | None, *, finish_reason: str = "stop") -> Reply:
        """A completion whose content is exactly ``content`` (garbage, prose, fences, None)."""
        return cls("text", content, finish_reason=finish_reason)

    @classmethod
    def prose(cls, obj: Any, *, before: str = "Sure! Here is what I found:", after: str = "Let me know if you need more.") -> Reply:
        """A completion with ``obj`` as JSON inside prose, as models that ignore
        ``response_format`` answer."""
        return cls("text", f"{before}\n{json.dumps(obj, ensure_ascii=False)}\n{after}")

    @classmethod
    def status(cls, code: int, body: str | dict[str, Any] = "", *, headers: dict[str, str] | None = None) -> Reply:
        """An HTTP error (or any status) with a raw body; a dict body is JSON-encoded."""
        return cls("status", (body, dict(headers or {})), status_code=code)

    @classmethod
    def body(cls, raw: str, *, status: int = 200, content_type: str = "application/json") -> Reply:
        """A raw HTTP body instead of a completion envelope (e.g. a malformed envelope)."""
        return cls("body", raw, status_code=status, content_type=content_type)

    @classmethod
    def delay(cls, seconds: float, then: Any = None) -> Reply:
        """Sleep ``seconds`` and then answer ``then`` (a Reply, an output dict, or None for
        the task's handler)."""
        return cls("delay", seconds=seconds, then=then)

    def __repr__(self) -> str:
        return f"Reply({self.kind!r}, status={self.status_code})"


Handler = Callable[[dict[str, Any]], "dict[str, Any] | Reply"]


# --- default handlers ------------------------------------------------------------------------


def _flatten(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def last_user_text(request: dict[str, Any]) -> str:
    """Content of the last user message of a chat request ('' if none)."""
    for message in reversed(request.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _flatten(message.get("content"))
    return ""


def prompt_text(request: dict[str, Any]) -> str:
    """All message contents of a chat request, joined by newlines."""
    return "\n".join(_flatten(m.get("content")) for m in request.get("messages") or [] if isinstance(m, dict))


def request_features(request: dict[str, Any]) -> set[str]:
    """Dialect features a chat request carries: its response_format type and the names of
    the token-limit parameters present."""
    features = {name for name in ("max_completion_tokens", "max_tokens") if name in request}
    response_format = request.get("response_format")
    if isinstance(response_format, dict) and isinstance(response_format.get("type"), str):
        features.add(response_format["type"])
    return features


_ID = re.compile(r"\b(?:fact|ref|prom|card|legacy|manual|corr)_[0-9A-Za-z_]+")


def _rerank(request: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, None] = {}
    for match in _ID.finditer(last_user_text(request) or prompt_text(request)):
        seen.setdefault(match.group(0), None)
    return {"ids": list(seen)}


DEFAULT_HANDLERS: dict[str, Handler] = {
    "summarize_recent": lambda req: {"summary": "summary: " + last_user_text(req)[:60]},
    "review_recent": lambda req: {"explanation": "", "corrected_dialogue": []},
    "extract_facts": lambda req: {"facts": []},
    "extract_self_disclosure": lambda req: {"facts": []},
    "map_evidence": lambda req: {"signals": []},
    "judge_duplicates": lambda req: {"decisions": []},
    "synthesize_reflection": lambda req: {"reflection": None},
    "check_feedback": lambda req: {"feedback": []},
    "check_disputation": lambda req: {"disputed": []},
    "judge_promotion": lambda req: {"action": "reject", "target_id": None, "text": None, "reason": "fake default"},
    "resolve_correction": lambda req: {"action": "keep_old", "text": None},
    "rerank": _rerank,
    "refine_cluster": lambda req: {"actions": []},
}


# --- the server --------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default 5 drops bursts of connections from a worker pool

    def __init__(self, fake: FakeLLM) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", 0), _RequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up on a kept-alive connection (a cancelled call, a pool closed
        # at shutdown) resets it while the handler waits for the next request line: that is
        # the client's choice, not the stand-in's failure, and printing its traceback made a
        # bench's clean run look broken. Anything else is still printed.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the client's connection pool is exercised
    disable_nagle_algorithm = True  # headers and body are two writes: avoid the 40 ms ACK stall
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client gave up (e.g. its timeout)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path != CHAT_PATH:
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        try:
            request = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self._send(400, b'{"error": {"message": "body is not JSON"}}')
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        task = headers.get(TASK_HEADER, "")
        fake = self.server.fake
        fake._record({"task": task, "path": self.path, "headers": headers, "body": request})
        if not task:
            self._send(400, b'{"error": {"message": "missing X-Nekomem-Task header"}}')
            return
        fake._global_wait(task)
        try:
            refusal = fake._refusal(request)
            reply = refusal if refusal is not None else fake._resolve(task, request)
            self._answer(task, request, reply)
        except Exception as exc:  # noqa: BLE001 - a failing test handler: make it visible, keep serving
            self._send(500, json.dumps({"error": {"message": f"fake handler raised {type(exc).__name__}: {exc}"}}).encode())

    def _answer(self, task: str, request: dict[str, Any], reply: Reply) -> None:
        fake = self.server.fake
        while reply.kind == "delay":
            fake._wait(reply.seconds)
            then = reply.then
            reply = fake._handler_reply(task, request) if then is None else _as_reply(then)
        if reply.kind == "status":
            body, extra = reply.value
            data = json.dumps(body).encode() if isinstance(body, dict) else str(body).encode()
            self._send(reply.status_code, data, headers=extra)
            return
        if reply.kind == "body":
            self._send(reply.status_code, str(reply.value).encode(), reply.content_type)
            return
        content = reply.value if reply.kind == "text" else json.dumps(reply.value, ensure_ascii=False)
        if reply.kind == "json" and fake._wrap_in_prose:
            content = f"Sure! Here is what I found:\n```json\n{content}\n```\nLet me know if you need more."
        self._send(200, json.dumps(fake._completion(request, content, reply.finish_reason), ensure_ascii=False).encode())


def _as_reply(value: Any) -> Reply:
    if isinstance(value, Reply):
        return value
    if isinstance(value, dict):
        return Reply.json(value)
    raise TypeError(f"a handler must return a dict or a Reply, not {type(value).__name__}")


class FakeLLM:
    """Scripted OpenAI-compatible server; see the module docstring. Thread-safe."""

    def __init__(self, *, model: str = "fake-llm") -> None:
        self.model = model
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._handlers: dict[str, Handler] = {}
        self._queues: dict[str, deque[Any]] = {}
        self._delays: dict[str | None, float] = {}
        self._calls: list[dict[str, Any]] = []
        self._refuse: dict[str, Reply] = {}
        self._wrap_in_prose = False
        self._ids = itertools.count(1)
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> FakeLLM:
        """Bind an ephemeral port and serve from a daemon thread."""
        if self._server is not None:
            return self
        self._closing.clear()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-llm", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; pending delays are cut short. Idempotent."""
        self._closing.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeLLM is not running")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (what a client's base URL setting takes)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # --- scripting --------------------------------------------------------------------------

    def on(self, task: str, handler: Handler | dict[str, Any] | Reply) -> FakeLLM:
        """Answer ``task`` with ``handler(request_body)``; a dict or Reply is a constant answer."""
        if not callable(handler):
            constant = handler
            handler = lambda _request: constant  # noqa: E731
        with self._lock:
            self._handlers[task] = handler
        return self

    def queue(self, task: str, *replies: Reply | dict[str, Any]) -> FakeLLM:
        """Append one-shot replies for ``task``, used in order before the handler."""
        with self._lock:
            self._queues.setdefault(task, deque()).extend(replies)
        return self

    def set_delay(self, task: str | None, seconds: float) -> FakeLLM:
        """Sleep ``seconds`` before answering ``task`` (None: every task). 0 turns it off."""
        with self._lock:
            if seconds > 0:
                self._delays[task] = seconds
            else:
                self._delays.pop(task, None)
        return self

    def set_dialect(self, *, refuse: dict[str, Reply] | None = None, wrap_in_prose: bool = False) -> FakeLLM:
        """Play a server dialect: a request carrying a feature named in ``refuse`` (see
        ``request_features``) gets that reply; ``wrap_in_prose`` ignores response_format and
        wraps every JSON answer in prose and a code fence. No arguments: plain OpenAI."""
        with self._lock:
            self._refuse = dict(refuse or {})
            self._wrap_in_prose = wrap_in_prose
        return self

    def reset(self) -> None:
        """Forget recorded calls, queued replies, handlers, delays and the dialect."""
        with self._lock:
            self._refuse.clear()
            self._wrap_in_prose = False
            self._calls.clear()
            self._queues.clear()
            self._handlers.clear()
            self._delays.clear()

    # --- inspection -------------------------------------------------------------------------

    def calls(self, task: str | None = None) -> list[dict[str, Any]]:
        """Recorded requests (oldest first), each ``{"task", "path", "headers", "body"}``;
        header names are lower-case."""
        with self._lock:
            return [dict(c) for c in self._calls if task is None or c["task"] == task]

    def tally(self) -> dict[str, int]:
        """Recorded requests per task."""
        with self._lock:
            counts: dict[str, int] = {}
            for call in self._calls:
                counts[call["task"]] = counts.get(call["task"], 0) + 1
            return counts

    def wait_for_calls(self, count: int, task: str | None = None, timeout: float = 10.0) -> bool:
        """Block until at least ``count`` matching requests arrived; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(1 for c in self._calls if task is None or c["task"] == task) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    # --- used by the request handler ----------------------------------------------------------

    def _record(self, call: dict[str, Any]) -> None:
        with self._changed:
            self._calls.append(call)
            self._changed.notify_all()

    def _global_wait(self, task: str) -> None:
        with self._lock:
            seconds = self._delays.get(task, self._delays.get(None, 0.0))
        if seconds:
            self._wait(seconds)

    def _wait(self, seconds: float) -> None:
        self._closing.wait(seconds)

    def _handler_reply(self, task: str, request: dict[str, Any]) -> Reply:
        with self._lock:
            handler = self._handlers.get(task) or DEFAULT_HANDLERS.get(task)
        if handler is None:
            return Reply.status(400, {"error": {"message": f"fake LLM has no handler for task {task!r}"}})
        return _as_reply(handler(request))

    def _refusal(self, request: dict[str, Any]) -> Reply | None:
        features = request_features(request)
        with self._lock:
            return next((reply for feature, reply in self._refuse.items() if feature in features), None)

    def _resolve(self, task: str, request: dict[str, Any]) -> Reply:
        with self._lock:
            pending = self._queues.get(task)
            queued = pending.popleft() if pending else None
        if queued is not None:
            return _as_reply(queued)
        return self._handler_reply(task, request)

    def _completion(self, request: dict[str, Any], content: str | None, finish_reason: str) -> dict[str, Any]:
        prompt_chars = len(prompt_text(request))
        completion_chars = len(content or "")
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }
            ],
            # rough 4-chars-per-token figures: the fake only needs plausible numbers
            "usage": {
                "prompt_tokens": prompt_chars // 4,
                "completion_tokens": completion_chars // 4,
                "total_tokens": (prompt_chars + completion_chars) // 4,
            },
        }
