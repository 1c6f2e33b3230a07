"""Defensive extraction of one JSON object from model output.

Models wrap their JSON in code fences, put prose around it, leave trailing commas, or emit a
reasoning block first. :func:`extract_json_object` tries, in order: the whole text, each
fenced block, then every ``{`` that opens a balanced object, each as is and with trailing
commas removed. Error messages never quote the output (it may hold memory text).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["ModelOutputError", "extract_json_object", "strip_trailing_commas"]


class ModelOutputError(ValueError):
    """Model output has no usable JSON object, or the object has the wrong shape."""


_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\r?\n?(.*?)```", re.DOTALL)
_THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)

# Bounds the work spent on adversarial output full of stray braces (each try is O(n)).
_MAX_BRACE_CANDIDATES = 64


def strip_trailing_commas(text: str) -> str:
    """Remove commas that directly precede ``}`` or ``]`` (outside strings)."""
    out: list[str] = []
    in_string = False
    escaped = False
    pending_comma: list[str] | None = None  # the comma plus the whitespace after it
    for ch in text:
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if pending_comma is not None:
            if ch in " \t\r\n":
                pending_comma.append(ch)
                continue
            if ch in "}]":
                out.extend(pending_comma[1:])  # drop the comma, keep the layout
            else:
                out.extend(pending_comma)
            pending_comma = None
        if ch == ",":
            pending_comma = [ch]
            continue
        out.append(ch)
        if ch == '"':
            in_string = True
    if pending_comma is not None:
        out.extend(pending_comma)
    return "".join(out)


def _balanced_end(text: str, start: int) -> int | None:
    """Index one past the ``}`` that closes the ``{`` at ``start``; None if never closed."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _loads_object(candidate: str) -> dict[str, Any] | None:
    candidate = candidate.strip()
    if not candidate.startswith("{"):
        return None
    for attempt in (candidate, strip_trailing_commas(candidate)):
        try:
            value = json.loads(attempt)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
        return None
    return None


def _scan(text: str) -> dict[str, Any] | None:
    tried = 0
    position = text.find("{")
    while position != -1 and tried < _MAX_BRACE_CANDIDATES:
        tried += 1
        end = _balanced_end(text, position)
        if end is not None:
            found = _loads_object(text[position:end])
            if found is not None:
                return found
        position = text.find("{", position + 1)
    return None


def extract_json_object(text: str) -> dict[str, Any]:
    """Return the first JSON object found in ``text``.

    Accepts bare JSON, fenced JSON (```json ... ```), JSON with prose before or after it,
    JSON with trailing commas, and output that starts with a ``<think>`` block.
    Raises ModelOutputError when no object can be recovered; the message says why but does
    not quote the output.
    """
    if not isinstance(text, str):
        raise ModelOutputError(f"model output is {type(text).__name__}, not text")
    if not text.strip():
        raise ModelOutputError("model output is empty")
    cleaned = _THINK.sub("", text).strip()

    found = _loads_object(cleaned)
    if found is not None:
        return found
    for match in _FENCE.finditer(cleaned):
        block = match.group(1)
        found = _loads_object(block)
        if found is None:
            found = _scan(block)
        if found is not None:
            return found
    found = _scan(cleaned)
    if found is not None:
        return found

    if "{" not in cleaned:
        stripped = cleaned.lstrip()
        if stripped.startswith("["):
            raise ModelOutputError(f"model output is a JSON array, not an object ({len(text)} chars)")
        raise ModelOutputError(f"no JSON object in model output ({len(text)} chars, no '{{')")
    raise ModelOutputError(
        f"no parseable JSON object in model output ({len(text)} chars; braces found but "
        "no balanced, valid object)"
    )
