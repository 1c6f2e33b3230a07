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
