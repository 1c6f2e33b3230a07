"""The recall layer as a plain object over FakePorts: no RecallActor, no runtime. Its
handlers are called directly; its deadlines, sends and model jobs are read from the ports."""

from __future__ import annotations

from pathlib import Path

from nekomem.actors.messages import IndexUpsert, IndexWaitOver, QueryMemory, RequestIndex
from nekomem.domain.index_entry import IndexEntry
from nekomem.layers.recall.layer import RecallLayer
from nekomem.runtime.reply import Reply
from tests.support.fake_ports import FakePorts
from tests.support.live import make_settings


def recall_over(tmp_path: Path) -> tuple[RecallLayer, FakePorts]:
    settings = make_settings(tmp_path, embedding_enabled=False, recall_journal_fallback_rows=0)
    ports = FakePorts(settings, tmp_path, "recall")
    layer = RecallLayer(ports)
    layer.load()
    return layer, ports


def texts(reply: Reply) -> list[str]:
    body = reply.result(5)
    return [row.text for row in body.results]


def test_a_query_before_every_owner_fed_the_index_waits_for_them_within_the_deadline(tmp_path: Path) -> None:
    layer, ports = recall_over(tmp_path)
    wait = ports.settings.recall.recall_index_wait_seconds
    assert ports.deadlines == [(wait, IndexWaitOver())]  # the held query's bound, on the runtime's deadlines

    held = Reply()
    layer.on_QueryMemory(QueryMemory(query="cat", reply=held))
    facts = [
        IndexEntry(id="f1", tier="fact", text="Master's cat is called Mochi"),
        IndexEntry(id="f2", tier="fact", text="Master plays the cello"),
    ]
    layer.on_IndexUpsert(IndexUpsert(entries=facts, replace_tier="fact"))
    assert not held.done  # the reflections have not sent theirs yet
    layer.on_IndexUpsert(IndexUpsert(entries=[], replace_tier="reflection"))

    assert texts(held) == ["Master's cat is called Mochi"]
    assert ports.jobs == []  # BM25 alone: no model job


def test_the_wait_over_answers_a_held_query_with_what_is_indexed(tmp_path: Path) -> None:
    layer, _ports = recall_over(tmp_path)
    layer.on_IndexUpsert(IndexUpsert(entries=[IndexEntry(id="f1", tier="fact", text="Master's cat is called Mochi")], replace_tier="fact"))
    held = Reply()
    layer.on_QueryMemory(QueryMemory(query="Mochi", reply=held))
    assert not held.done

    layer.on_index_wait_over(IndexWaitOver())  # what the deadline posts
    assert texts(held) == ["Master's cat is called Mochi"]


def test_a_second_load_is_a_restart_and_asks_every_owner_for_its_index_again(tmp_path: Path) -> None:
    layer, ports = recall_over(tmp_path)
    # A first activation: the reflections send their index by themselves; the facts, read
    # only when needed, are asked for theirs at once, as no segment of them will answer.
    assert ports.sent == [("facts", RequestIndex(wake=True))]
    layer.close()
    ports.sent = []

    layer.load()
    assert sorted(child for child, message in ports.sent if isinstance(message, RequestIndex)) == ["facts", "reflections"]
    assert not any(isinstance(message, RequestIndex) and message.wake for _child, message in ports.sent)
