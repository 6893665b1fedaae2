"""How dataset preparation reports progress: tqdm bars on a terminal, plain `prepare: ...` lines
elsewhere (CI, a log file, a pipeline step's log; see trainer/prepare.py's docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO


@dataclasses.dataclass
class Progress:
    """How preparation reports progress. bars: tqdm bars for a terminal (else TFDS's are switched
    off, process-wide); without, `count` prints a line when the count passes a multiple of `step`
    of the total if `min_gap_s` has passed since the last line, whenever `interval_s` passes
    without one, and when complete. out: where lines go (None: sys.stdout when printing). stop:
    called at every `update`, raises to stop the work (trainer.prepare's SIGTERM)."""

    bars: bool
    out: TextIO | None = None
    step: float = 0.1
    min_gap_s: float = 5.0
    interval_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    stop: Callable[[], None] = lambda: None

    @classmethod
    def auto(cls) -> Progress:
        """Bars when both stdout and stderr are terminals (tqdm draws on stderr, lines go to stdout)."""
        try:
            terminal = sys.stdout.isatty() and sys.stderr.isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            terminal = False
        return cls(bars=terminal and os.environ.get("TERM") != "dumb")

    def say(self, message: str) -> None:
        print(f"prepare: {message}", file=self.out or sys.stdout, flush=True)

    @contextlib.contextmanager
    def count(
        self, label: str, total: int, *, desc: str | None = None, bar: bool = True, lines: bool = True
    ) -> Iterator[Callable[[int], None]]:
        """Yields `update(n)`, to call as images are done. With bars: a tqdm bar titled `desc`
        (default `label`), unless `bar` is False. Without: lines such as
        "prepare: train 1200/5656 images (21%)", unless `lines` is False."""
        if self.bars and bar:
            from tqdm import tqdm

            with tqdm(total=total, desc=desc or label, unit="img", mininterval=1.0) as b:

                def advance(n: int = 1) -> None:
                    self.stop()
                    b.update(n)

                yield advance
        elif self.bars or not lines:
            yield lambda n: self.stop()
        else:
            start = last = self.clock()
            every, done = max(1, math.ceil(total * self.step)), 0

            def update(n: int = 1) -> None:
                nonlocal done, last
                self.stop()
                done += n
                now = self.clock()
                passed = done // every > (done - n) // every  # a multiple of `every`, in this update
                waited = now - last
                if done < total and ((passed and waited >= self.min_gap_s) or waited >= self.interval_s):
                    self.say(f"{label} {_fraction(done, total)}")
                    last = now

            yield update
            self.say(f"{label} {_fraction(done, total)} in {self.clock() - start:.1f}s")


def _fraction(done: int, total: int) -> str:
    percent = 100 * done // total if total else 100  # floor: 100% only when complete
    return f"{done}/{total} images ({percent}%)"
