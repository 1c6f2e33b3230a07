"""The stand-in LLM server of the tests and benches: a client hanging up on a kept-alive
connection is not the server's failure and prints nothing (a bench's smoke run failed on
the traceback it printed); any other error in a request's handling is still printed."""

from __future__ import annotations

import pytest

from tests.support.fake_llm import FakeLLM


@pytest.mark.parametrize("hang_up", [ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe"), ConnectionAbortedError()])
def test_a_client_hanging_up_prints_nothing(capsys: pytest.CaptureFixture[str], hang_up: OSError) -> None:
    with FakeLLM() as fake:
        try:
            raise hang_up
        except OSError:
            fake._server.handle_error(None, ("127.0.0.1", 1))
    assert capsys.readouterr().err == ""


def test_any_other_error_is_still_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeLLM() as fake:
        try:
            raise ValueError("a bug in a handler")
        except ValueError:
            fake._server.handle_error(None, ("127.0.0.1", 1))
    err = capsys.readouterr().err
    assert "Traceback" in err and "a bug in a handler" in err
