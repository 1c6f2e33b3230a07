"""Defensive extraction of one JSON object from model output.

Models wrap their JSON in code fences, put prose around it, leave trailing commas, or emit a
reasoning block first. :func:`extract_json_object` tries, in order: the whole text, each
fenced block, then every ``{`` that opens a balanced object, each as is and with trailing
commas removed; as a last resort the ``json-repair`` library (single quotes, unquoted keys,
Python literals, comments, raw newlines in strings). :func:`salvage_truncated_object` keeps
the complete items of an answer that stopped at its token limit. Error messages never
quote the output (it may hold memory text).
"""

from __future__ import annotations

import json
import re
from typing import Any

import json_repair

__all__ = ["ModelOutputError", "extract_json_object", "salvage_truncated_object", "strip_trailing_commas"]


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
    JSON with trailing commas, and output that starts with a ``<think>`` block; as a last
    resort, what ``json-repair`` recovers from single quotes, unquoted keys, Python
    literals, comments or raw newlines in strings (never from a cut-off object).
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
    found = _repair(cleaned)
    if found is not None:
        return found

    if "{" not in cleaned:
        stripped = cleaned.lstrip()
        if stripped.startswith("["):
            raise ModelOutputError(f"model output is a JSON array, not an object ({len(text)} chars)")
        raise ModelOutputError(f"no JSON object in model output ({len(text)} chars, no '{{')")
    raise ModelOutputError(f"no parseable JSON object in model output ({len(text)} chars; braces found but no balanced, valid object)")


def _repair(cleaned: str) -> dict[str, Any] | None:
    """The first object ``json-repair`` recovers from ``cleaned``, or None.

    Text with more ``{`` than ``}`` was cut off: repairing it would invent the missing end
    (``{"summary": `` becomes an empty summary), so it is left to the truncation rule.
    """
    start = cleaned.find("{")
    if start == -1 or cleaned.count("}") < cleaned.count("{"):
        return None
    fenced = _FENCE.search(cleaned)
    source = fenced.group(1) if fenced and "{" in fenced.group(1) else cleaned[start:]
    try:
        value = json_repair.repair_json(source, return_objects=True, skip_json_loads=True)
    except (ValueError, RecursionError):  # the library's own failure modes on odd input
        return None
    if isinstance(value, list):
        value = next((item for item in value if isinstance(item, dict)), None)
    if isinstance(value, dict) and value:
        return value
    return None


def _item_ends(text: str) -> tuple[list[tuple[int, int]], bool]:
    """Where items of the root object's arrays end in ``text`` (which starts with ``{``).

    Returns ``(end, array_start)`` for each complete element of an array that is a value of
    the root object (``{"facts": [ITEM, ITEM, ...``): the offset just after the element and
    the offset of its array's ``[``; and whether the root object closed. A bare number or
    literal counts only once a comma follows it (``12`` may be ``123`` cut short).
    """
    ends: list[tuple[int, int]] = []
    depth: list[str] = []
    in_string = escaped = pending_scalar = False
    array_start = 0
    for i, ch in enumerate(text):
        item_level = depth == ["{", "["]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if item_level:
                    ends.append((i + 1, array_start))
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            if depth == ["{"] and ch == "[":
                array_start = i
            depth.append(ch)
            pending_scalar = False
        elif ch in "}]":
            if not depth:
                break
            depth.pop()
            if not depth:
                return ends, True
            if depth == ["{", "["]:
                ends.append((i + 1, array_start))
        elif ch == ",":
            if item_level and pending_scalar:
                ends.append((i, array_start))
            pending_scalar = False
        elif item_level and not ch.isspace():
            pending_scalar = True
    return ends, False


def salvage_truncated_object(text: str) -> tuple[dict[str, Any], int]:
    """The object of an answer cut off at its token limit, without its unfinished last item.

    The text is cut after the last complete element of an array held by the root object and
    the open array and object are closed; the result is parsed like any answer. Returns the
    object and the number of complete items kept in the array that was cut. Raises
    ModelOutputError when not one item was complete (nothing worth keeping), the object was
    not cut at all, or what is left does not parse.
    """
    cleaned = _THINK.sub("", text).strip() if isinstance(text, str) else ""
    start = cleaned.find("{")
    if start == -1:
        raise ModelOutputError(f"truncated model output has no JSON object ({len(cleaned)} chars)")
    body = cleaned[start:]
    ends, closed = _item_ends(body)
    if closed:
        raise ModelOutputError("model output holds a complete object that does not parse")
    if not ends:
        raise ModelOutputError(f"truncated model output holds no complete item ({len(cleaned)} chars)")
    cut, array_start = ends[-1]
    kept = sum(1 for _end, start_of in ends if start_of == array_start)
    closed_text = body[:cut] + "]}"
    found = _loads_object(closed_text)
    if found is None:
        found = _repair(closed_text)
    if found is None:
        raise ModelOutputError(f"truncated model output does not parse without its last item ({len(cleaned)} chars)")
    return found, kept
