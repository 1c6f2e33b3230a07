from __future__ import annotations

import logging

import pytest

from tests.support.fake_llm import FakeLLM


@pytest.fixture
def fake_llm():
    with FakeLLM() as llm:
        yield llm


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.WARNING)
    yield


@pytest.fixture(scope="session")
def embedding_service(tmp_path_factory):
    """The real default embedding model, shared by the tests of one run (skips when the
    model is not installed: `make test` installs it)."""
    from pathlib import Path

    from nekomem.models.embeddings import EmbeddingService
    from tests.support.live import make_settings

    model = Path(__file__).resolve().parents[1] / "models" / "use-multilingual-v3" / "model.onnx"
    if not model.is_file():
        pytest.skip(f"embedding model not installed at {model} (run scripts/fetch_model.py)")
    service = EmbeddingService(make_settings(tmp_path_factory.mktemp("emb")).embeddings)
    service.start()
    if not service.wait_ready(60):
        pytest.fail(f"embedding model did not load: {service.reason}")
    return service
