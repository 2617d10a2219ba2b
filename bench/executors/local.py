"""The local executor: every job in this process, one after another, in the runner's order."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from bench.executors.base import DONE, FAILED, RUNNING, Board, Job, TimingHost, check_order, first_line, this_host


class LocalExecutor:
    name = "local"
    shows_progress = True            # jobs run here: their own progress bars are the user's

    @contextlib.contextmanager
    def quiet_host(self) -> Iterator[TimingHost]:
        """This process: nothing to stop, every job ran here and is done."""
        yield TimingHost(this_host(), {"executor": self.name})

    def run(self, jobs: list[Job], board: Board) -> dict[str, Any]:
        check_order(jobs)
        board.add(jobs)
        results: dict[str, Any] = {}
        for job in jobs:
            call = job.build(results)
            board.set(job.key, RUNNING, host=this_host(), attempt=1)
            start = time.perf_counter()
            try:
                result = call(*(results[k] for k in job.needs))
            except BaseException as err:
                board.set(job.key, FAILED, seconds=round(time.perf_counter() - start, 1), error=first_line(err))
                raise
            results[job.key] = result
            job.done(result, results)
            board.set(job.key, DONE, seconds=round(time.perf_counter() - start, 1))
        return results
