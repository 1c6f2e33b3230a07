"""What the chat-model re-rank of explicit recalls (``recall_llm_rerank``) costs per query:
model calls, prompt tokens sent, and the recall's latency with and without it.

Run from the project root::

    .venv/bin/python -m bench.llm_rerank_cost [--data ../shared/data/locomo-dev]
        [--conversations conv-30] [--questions 40] [--model-ms 0] [--top-n 20] [--vectors] [--smoke]

A LoCoMo conversation's observations are imported as facts into a fresh in-process server
(real HTTP on 127.0.0.1) that has a chat model configured: the loopback fake model of
``tests/support/fake_llm.py``, which answers the rerank task by listing the candidates' ids
in the order it was given them (so the rows do not change) after ``--model-ms``
milliseconds, standing in for a real model's time. Each question is asked through
``POST /query_memory`` twice, with ``recall_llm_rerank`` off and on (two servers, the same
facts; BM25 legs only unless ``--vectors``); printed are the model calls per query, the prompt tokens sent per call (nekomem's
own count, the ``recent_tokenizer_encoding``, as ``/health`` reports it), the characters of
the prompt, and the recall's p50 / p95 latency both ways. The quality of a real model's
order is not measured here: the fake has none.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from bench._common import percentile, smoke_option
from bench.locomo_quality import conversation_files, load_conversation, resolve_data, smoke_folder
from nekomem.config import load_settings
from nekomem.models.embeddings import EmbeddingService
from tests.support.fake_llm import FakeLLM
from tests.support.live import LiveServer

NAME = "locomo"


def run(
    facts: list[dict[str, Any]], questions: list[str], llm: FakeLLM, on: bool, top_n: int, vectors: bool
) -> tuple[list[float], dict[str, Any]]:
    """Ask ``questions`` of a fresh server holding ``facts``; (latencies in s, /health's reranker)."""
    with tempfile.TemporaryDirectory(prefix="nekomem-llm-rerank-") as tmp:
        settings = load_settings(
            None,
            env={},
            overrides={
                "memory_root": tmp,
                "port": 0,
                "embedding_enabled": vectors,  # with vectors: more legs, more candidates in the prompt
                "llm_base_url": llm.base_url,
                "llm_model": "fake",
                "recall_llm_rerank": on,
                "recall_rerank_top_n": top_n,
                "gc_full_collection_seconds": 0,
            },
        )
        service = EmbeddingService(settings.embeddings)
        if vectors:
            service.start()
            if not service.wait_ready(300):
                raise RuntimeError(f"embeddings unavailable ({service.reason})")
        with LiveServer(settings, embeddings=service) as srv:
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).raise_for_status()
            if vectors:
                srv.wait_vectors(NAME, timeout=900)
            srv.post(f"/query_memory/{NAME}", json={"query": "warm-up"}).raise_for_status()
            latencies: list[float] = []
            for question in questions:
                started = time.perf_counter()
                body = srv.post(f"/query_memory/{NAME}", json={"query": question}).json()
                latencies.append(time.perf_counter() - started)
                if "error_code" in body:
                    raise RuntimeError(f"recall failed: {body}")
            health = srv.get("/health").json()["reranker"]
        service.close()
        return latencies, health


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/data/locomo-dev")
    parser.add_argument("--conversations", default="conv-30")
    parser.add_argument("--questions", type=int, default=40, help="questions asked each way")
    parser.add_argument("--model-ms", type=float, default=0.0, help="the fake model's answer time (a real model's, e.g. 800)")
    parser.add_argument("--top-n", type=int, default=20, help="recall_rerank_top_n: candidates in the prompt")
    parser.add_argument("--vectors", action="store_true", help="the default embedding model too (its legs add candidates)")
    smoke = smoke_option(parser, argv, questions=3)
    args = parser.parse_args(argv)
    folder = resolve_data(args.data)
    if smoke:
        folder = smoke_folder(folder)
        args.conversations = ""
    files = conversation_files(folder, args.conversations)[:1]
    if not files:
        raise SystemExit(f"no conversation in {folder}")
    facts, qa = load_conversation(files[0], "none")
    questions = [q["question"] for q in qa][: args.questions]
    with FakeLLM() as llm:
        if args.model_ms > 0:
            llm.set_delay("rerank", args.model_ms / 1000)
        off, _ = run(facts, questions, llm, False, args.top_n, args.vectors)
        calls_before = len(llm.calls("rerank"))
        on, health = run(facts, questions, llm, True, args.top_n, args.vectors)
        calls = len(llm.calls("rerank")) - calls_before
        prompts = [sum(len(str(m.get("content", ""))) for m in c["body"]["messages"]) for c in llm.calls("rerank")[calls_before:]]
    asked = len(questions) + 1  # with the warm-up
    tokens = health.get("tokens_sent", 0)
    print(
        f"LoCoMo {files[0].stem}: {len(facts)} facts, {len(questions)} questions, top_n={args.top_n}, fake model time {args.model_ms:.0f} ms, vectors {args.vectors}"
    )
    print(
        f"model calls per explicit recall: {calls / asked:.2f} ({calls} calls for {asked} recalls, none when fewer than 2 "
        f"candidates; failures {health.get('failures')})"
    )
    if calls:
        print(f"prompt per call: {tokens / calls:.0f} tokens, {statistics.fmean(prompts):.0f} characters")
    for label, values in (("off", off), ("on", on)):
        ordered = sorted(values)
        print(f"recall latency {label:>3}: p50 {percentile(ordered, 50) * 1000:.1f} ms, p95 {percentile(ordered, 95) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
