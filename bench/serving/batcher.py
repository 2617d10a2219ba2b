"""The dynamic batcher: queries in, batches out to one server, as a serving stack batches for one model.

LoadGen's threads hand queries to ``submit`` and return at once. One batcher thread owns the server (the
system's worker process, which decodes one batch at a time): whenever the server is free it takes the
waiting queries, at most ``max_batch`` of them, holding a partial batch up to ``max_wait`` after its
oldest query arrived for more to come (``max_wait = 0``: serve what is waiting now, as Triton's dynamic
batcher does by default). With ``length`` (a sample index -> its source's length), a batch cut from more
waiting queries than fit is the oldest query and the waiting ones closest to it in length, so that a batch
pads less (the oldest is always served next: no query starves); otherwise the oldest ``max_batch``. The
server's outputs go to ``complete`` with the batch's queries. Nothing here imports LoadGen or a model:
``serve``, ``complete`` and ``length`` are callbacks.
"""
from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Query:
    id: int                  # LoadGen's response id
    index: int               # the sample's position in the query sample library (the test set)
    arrived_ns: int          # when ``submit`` received it (time.monotonic_ns)


class DynamicBatcher:
    """Forms batches of waiting queries for one server; ``batches`` counts the batch sizes it served."""

    def __init__(self, serve: Callable[[list[int]], list[str]],
                 complete: Callable[[list[Query], list[str]], None], max_batch: int, max_wait_s: float,
                 length: Callable[[int], int] | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._serve, self._complete, self._length = serve, complete, length
        self.max_batch, self.max_wait_ns = int(max_batch), int(max_wait_s * 1e9)
        self._pending: list[Query] = []
        self._cond = threading.Condition()
        self._closed = False
        self.batches: dict[int, int] = {}           # batch size -> batches served
        self.error: BaseException | None = None     # the first exception the server raised (the run then stops)
        self._thread = threading.Thread(target=self._loop, name="narbench-batcher", daemon=True)
        self._thread.start()

    def submit(self, ids_and_indices: Sequence[tuple[int, int]]) -> None:
        now = time.monotonic_ns()
        with self._cond:
            self._pending.extend(Query(i, j, now) for i, j in ids_and_indices)
            self._cond.notify()

    def close(self) -> None:
        """Serve what is waiting, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _take(self) -> list[Query] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            deadline = self._pending[0].arrived_ns + self.max_wait_ns
            while len(self._pending) < self.max_batch and not self._closed:
                left = deadline - time.monotonic_ns()
                if left <= 0:
                    break
                self._cond.wait(left / 1e9)
            return self._cut()

    def _cut(self) -> list[Query]:
        """Take a batch off the waiting queries (the lock held)."""
        pending, n = self._pending, self.max_batch
        if self._length is None or n == 1 or len(pending) <= n:
            batch, self._pending = pending[:n], pending[n:]
            return batch
        target = self._length(pending[0].index)
        chosen = {0, *heapq.nsmallest(n - 1, range(1, len(pending)),
                                      key=lambda i: abs(self._length(pending[i].index) - target))}
        self._pending = [q for i, q in enumerate(pending) if i not in chosen]
        return [q for i, q in enumerate(pending) if i in chosen]

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            self.batches[len(batch)] = self.batches.get(len(batch), 0) + 1
            try:
                outputs = self._serve([q.index for q in batch]) if self.error is None else [""] * len(batch)
            except BaseException as e:      # noqa: BLE001 - kept, and raised by the caller after LoadGen returns
                self.error, outputs = e, [""] * len(batch)
            self._complete(batch, outputs)  # LoadGen waits for every query, so even a failed one completes
