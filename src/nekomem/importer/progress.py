"""A one-line progress bar on a text stream (stderr), redrawn in place."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TextIO

_WIDTH = 30


class ProgressBar:
    """Counts handled records out of ``total`` and redraws only when the percentage moves.
    ``finish`` draws 100 % and ends the line."""

    def __init__(self, total: int, stream: TextIO, label: str = "import") -> None:
        self.total = max(1, total)
        self.stream = stream
        self.label = label
        self.done = 0
        self._shown = -1

    @contextlib.contextmanager
    def above_logs(self) -> Iterator[None]:
        """While inside, a log record written to this bar's stream first ends the bar's
        line (the bar is drawn again below it at the next count), so the two never share
        a line."""
        handlers = [h for h in logging.getLogger().handlers if getattr(h, "stream", None) is self.stream]

        def end_line(record: logging.LogRecord) -> bool:
            if self._shown >= 0:
                self.stream.write("\n")
                self._shown = -1  # redrawn on the next count
            return True

        for handler in handlers:
            handler.addFilter(end_line)
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(end_line)

    def __call__(self, n: int) -> None:
        self.done = min(self.total, self.done + max(0, n))
        self._draw()

    def _draw(self) -> None:
        percent = self.done * 100 // self.total
        if percent == self._shown:
            return
        self._shown = percent
        filled = self.done * _WIDTH // self.total
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (_WIDTH - filled)}] {percent:3d}% {self.done}/{self.total}")
        self.stream.flush()

    def finish(self, read: int | None = None) -> None:
        """Draw the last state: 100 %, and with ``read`` (the report's count of records
        read) that count, so the bar ends on the number the report gives."""
        if read is not None:
            self.total = max(1, read)
            self._shown = -1
        self.done = self.total
        self._draw()
        self.stream.write("\n")
        self.stream.flush()


def wanted(flag: bool, stream: TextIO, total: int, min_records: int) -> bool:
    """Draw a bar when asked to, or on a terminal for a folder of at least ``min_records``."""
    if flag:
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and total >= min_records
