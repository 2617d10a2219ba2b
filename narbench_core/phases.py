"""Per-phase latency: the names of a decode's phases and the recorder the timer opens around a window.

The timer (``bench.measure.timing``) opens a :class:`Recorder` around each timed call and closes the phases
it can see itself (``tokenize`` after ``prepare``, ``passes`` after the device wait, ``detokenize``
at the end). A decoder (in ``models/``, which does not import ``bench``) splits its own device work
by calling :func:`mark` and counts its blocking waits with :func:`sync`; both do nothing when no
recorder is open (warm-up, distillation, learning curves, tests that call a decoder directly).

A phase's time runs from the previous mark (or the window's start) to its own mark, so the phases of
one call partition its timed window: they add up to its latency exactly.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

TOKENIZE, ENCODE, HOST_SYNC, HOST, PASSES, DETOKENIZE = ("tokenize", "encode", "host_sync", "host", "passes",
                                                        "detokenize")
PHASES = (TOKENIZE, ENCODE, HOST_SYNC, HOST, PASSES, DETOKENIZE)   # display order
DOCS = {
    TOKENIZE: "source text to padded ids (host)",
    ENCODE: "the encoder, with length prediction for PaDIR, until its outputs are ready",
    HOST_SYNC: "reading device values back to the host (PaDIR's predicted lengths; the results)",
    HOST: "host work between runtime calls (PaDIR on ONNX Runtime: lengths, masks, remasking, the best hypothesis)",
    PASSES: "the decoder passes (AR steps, PaDIR refinement passes; CTranslate2: its whole translate call)",
    DETOKENIZE: "ids to text (host)",
}


class Recorder:
    """Milliseconds per phase and blocking waits of one timed call (``clock`` returns nanoseconds)."""

    def __init__(self, clock: Callable[[], int]):
        self.clock = clock
        self.start = self.last = clock()
        self.ms: dict[str, float] = {}
        self.syncs = 0

    def mark(self, phase: str) -> None:
        """Close ``phase`` now: the time since the last mark is added to it."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; use one of {PHASES}")
        now = self.clock()
        self.ms[phase] = self.ms.get(phase, 0.0) + (now - self.last) / 1e6
        self.last = now

    def sync(self) -> None:
        self.syncs += 1


_current: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("narbench_phase_recorder", default=None)


@contextlib.contextmanager
def recording(clock: Callable[[], int]) -> Iterator[Recorder]:
    """Open a recorder for one timed call; :func:`mark` and :func:`sync` report to it."""
    recorder = Recorder(clock)
    token = _current.set(recorder)
    try:
        yield recorder
    finally:
        _current.reset(token)


def mark(phase: str) -> None:
    """Close ``phase`` in the open recorder, if any (a decoder calls this inside ``run``/``finish``)."""
    recorder = _current.get()
    if recorder is not None:
        recorder.mark(phase)


def sync() -> None:
    """Count one blocking wait on the device in the open recorder, if any."""
    recorder = _current.get()
    if recorder is not None:
        recorder.sync()


def active() -> bool:
    """Whether a timed call is being recorded (a decoder may skip a phase boundary's wait otherwise)."""
    return _current.get() is not None
