"""/new_dialog has a "Long-term Memory" heading only when there is long-term memory."""

from __future__ import annotations

from tests.support.live import LiveServer, make_settings


def test_no_empty_long_term_heading(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "good morning"}]})
        for language, heading in (("en", "Long-term Memory"), ("zh", "长期记忆"), ("ja", "長期記憶")):
            text = srv.get("/new_dialog/Lan", params={"language": language}).text
            assert "good morning" in text and heading not in text, text
        card = {"entries": [{"entity": "neko", "text": "Lan is a grey cat"}]}
        assert srv.post("/api/characters/Lan/card", json=card).status_code == 200
        text = srv.get("/new_dialog/Lan", params={"language": "en"}).text
        assert text.index("======Lan's Long-term Memory======") < text.index("Lan is a grey cat") < text.index("good morning")
        sections = srv.get("/api/browse/Lan/context").json()["sections"]
        assert "".join(s["text"] for s in sections) == text
