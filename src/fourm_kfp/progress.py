"""Progress for long work: a tqdm bar on a terminal, else one log line per interval with rate and ETA.

KFP and Kubernetes collect logs line by line, where a carriage-return progress bar turns into noise, so outside
a terminal we print plain lines instead.
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def format_seconds(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LineProgress:
    """Prints ``desc: n/total (pct) rate unit/s, elapsed, ETA`` at most every ``interval`` seconds."""

    def __init__(self, total: int | None, desc: str, unit: str, interval: float, stream=None):
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.stream = stream or sys.stderr
        self.count = 0
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._print(now)

    def _print(self, now: float) -> None:
        elapsed = now - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        if self.total:
            eta = (self.total - self.count) / rate if rate > 0 else float("inf")
            eta_text = format_seconds(eta) if eta != float("inf") else "?"
            head = f"{self.count}/{self.total} ({100 * self.count / self.total:.0f}%)"
            tail = f"ETA {eta_text}"
        else:
            head, tail = f"{self.count}", ""
        print(f"{self.desc}: {head} {rate:.1f} {self.unit}/s, elapsed {format_seconds(elapsed)} {tail}".rstrip(),
              file=self.stream, flush=True)

    def close(self) -> None:
        self._print(time.monotonic())


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "", unit: str = "it",
             interval: float = 10.0) -> Iterator[T]:
    """Wrap ``iterable`` with a progress display suited to where the output goes."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        yield from tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True)
        return
    bar = LineProgress(total, desc, unit, interval)
    for item in iterable:
        yield item
        bar.update()
    bar.close()
