"""The Ray executor: a suite's training jobs on a Ray cluster (``narbench run --executor ray``).

- Without an address it starts a Ray instance on this machine (``ray.init``), so the bare command works
  anywhere; with one (``--address HOST:PORT``) it joins that cluster.
- Each job is a Ray task in a fresh worker process (``max_calls=1``), retried when its worker or node is
  lost (``max_retries``), never when it raises (``retry_exceptions=False``): a ``UserError`` in a job
  reaches the user as its one line. A job's needs are passed as object references, so Ray starts it
  once they are done.
- Every node must see the driver's data root at the same path (a shared filesystem): the driver writes a
  marker file there and every job checks it before it does anything (``check_marker``), so a node that
  does not see it fails the run in one line instead of training into its own disk. Workers write only
  under the data root (checkpoints, distillations, and their logs under ``ray/logs/<run id>/``); the
  driver copies each job's logs into the run folder (``<run>/logs/<job>.<attempt>.log``) and writes
  everything else there.
- Timing stays on the driver's machine: before the runner times, ``quiet_host`` stops the Ray instance
  this driver started, or, on a cluster, keeps a placeholder actor holding every CPU of the driver's
  node, so no training task is scheduled there while it times.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.executors.base import DONE, FAILED, RUNNING, Board, Job, check_order, first_line, this_host
from narbench_core import defaults
from narbench_core.errors import UserError

RAY_DIR = "ray"                 # under the data root: the driver's markers and the jobs' logs
MARKER_PREFIX = "driver-"
PASS_ENV = ("NARBENCH_", "XLA_FLAGS", "JAX_", "TF_CPP_MIN_LOG_LEVEL")   # the driver's settings every job gets


def slug(key: str) -> str:
    """A job's file name: its key's plain characters and 6 hex digits of the key (unique per key)."""
    plain = re.sub(r"[^A-Za-z0-9_.-]+", "-", key).strip("-.")[:80] or "job"
    return f"{plain}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"


# ------------------------------------------------------------------------------------ on the workers

def check_marker(token: str) -> None:
    """Refuse (one line) when this process's data root (``NARBENCH_DATA``, the driver's path) does not hold
    the driver's marker ``token``: this node does not see the driver's files."""
    from narbench_core.paths import data_root

    root = data_root(create=False)
    marker = root / RAY_DIR / f"{MARKER_PREFIX}{token}"
    try:
        seen = marker.read_text(encoding="utf-8").strip()
    except OSError:
        seen = None
    if seen != token:
        raise UserError(f"the Ray worker on {this_host()} does not see the driver's data root {root} (no {marker.name} "
                        "in it): put NARBENCH_DATA on a filesystem every node mounts at the same path")


def _claim_log(folder: Path, name: str) -> tuple[int, Path]:
    """The first free attempt number of job ``name`` and its log file, created (so two attempts never share one)."""
    folder.mkdir(parents=True, exist_ok=True)
    attempt = 1
    while True:
        path = folder / f"{name}.{attempt}.log"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            attempt += 1
            continue
        os.close(fd)
        return attempt, path


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors too: JAX's and TensorFlow's native logs) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", encoding="utf-8", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_job(token: str, env: dict[str, str], log_dir: str, key: str, call: bytes, *needs: Any) -> tuple[Any, dict]:
    """What a Ray task runs, in a fresh worker process: take the driver's settings (``env``: its data root,
    ``NARBENCH_*``, ``XLA_FLAGS`` ...; set here, not as Ray's runtime_env, which cold-starts every worker),
    check the data root, claim this attempt's log, then unpickle the job's call (only now: it may import
    JAX, which reads ``XLA_FLAGS`` once) and run it with its needs' results, its output (and a failure's
    traceback) going to the log. Returns (result, where it ran)."""
    os.environ.update(env)
    check_marker(token)
    attempt, log = _claim_log(Path(log_dir), slug(key))
    where = {"host": this_host(), "pid": os.getpid(), "attempt": attempt}
    start = time.perf_counter()
    with _output_to(log):
        print(json.dumps({"job": key, **where}), flush=True)      # the first line: `narbench status` reads it
        try:
            from ray import cloudpickle

            result = cloudpickle.loads(call)(*needs)
        except BaseException:
            traceback.print_exc()
            raise
    return result, {**where, "seconds": round(time.perf_counter() - start, 1)}


# -------------------------------------------------------------------------------------- the driver

def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("the Ray executor needs Ray: pip install 'narbench[ray]'") from None
    return ray


@dataclass
class RayExecutor:
    """Runs jobs as Ray tasks (see the module's doc)."""

    name = "ray"
    shows_progress = False                            # jobs run in workers: their output goes to their logs
    address: str | None = None                        # None: start a Ray instance on this machine
    run_id: str = "run"                               # names the jobs' log folder under the data root
    logs_to: Path | None = None                       # the run folder's logs/ (the driver copies logs there)
    max_retries: int = defaults.RAY_MAX_RETRIES
    cpus_per_job: float = defaults.RAY_CPUS_PER_JOB
    num_cpus: int | None = None                       # a local instance's CPUs (default: this machine's)
    poll_s: float = 1.0
    init_options: dict = field(default_factory=dict)  # more ray.init keywords (tests)
    _started: bool = False

    # ---------------------------------------------------------------------------------- connection

    def _connect(self) -> None:
        ray = _import_ray()
        if ray.is_initialized():
            return
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "namespace": "narbench",
                                   **self.init_options}
        if self.address is None:
            options.setdefault("num_cpus", self.num_cpus or os.cpu_count())
            options.setdefault("object_store_memory", defaults.RAY_OBJECT_STORE_BYTES)
        start = time.perf_counter()
        try:
            ray.init(address=self.address or "local", **options)    # "local": a new instance, never another
        except ConnectionError as err:
            raise UserError(f"cannot join the Ray cluster at {self.address}: {first_line(err)}; start it with "
                            "`ray start --head` and pass its address") from None
        self._started = self.address is None
        print(f"narbench: Ray {'started on this machine' if self._started else f'cluster {self.address} joined'} "
              f"in {time.perf_counter() - start:.1f} s ({_describe(ray)})", file=sys.stderr)

    def shutdown(self) -> None:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()

    # ----------------------------------------------------------------------------------------- run

    def run(self, jobs: list[Job], board: Board) -> dict[str, Any]:
        check_order(jobs)
        board.add(jobs)
        if not jobs:
            return {}
        self._connect()
        ray = _import_ray()
        from narbench_core.paths import subdir

        token = uuid.uuid4().hex
        marker = subdir(RAY_DIR) / f"{MARKER_PREFIX}{token}"
        from narbench_core.io import write_text

        write_text(marker, token + "\n")
        log_dir = subdir(RAY_DIR) / "logs" / self.run_id
        env = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV)}
        env["NARBENCH_DATA"] = str(marker.parents[1].absolute())
        task = ray.remote(max_calls=1)(run_job).options(num_cpus=self.cpus_per_job, max_retries=self.max_retries,
                                                        retry_exceptions=False, num_returns=2)
        results: dict[str, Any] = {}
        refs: dict[str, Any] = {}               # job key -> object ref of its result (what its dependents get)
        inflight: dict[Any, Job] = {}           # object ref of (where it ran) -> job
        waiting = list(jobs)
        try:
            while waiting or inflight:
                for job in [j for j in waiting if all(k in results for k in j.after) and all(k in refs for k in j.needs)]:
                    call = job.build(results)
                    result_ref, where_ref = task.remote(token, env, str(log_dir), job.key, ray.cloudpickle.dumps(call),
                                                        *(refs[k] for k in job.needs))
                    refs[job.key] = result_ref
                    inflight[where_ref] = job
                    waiting.remove(job)
                if not inflight:
                    raise RuntimeError(f"jobs {[j.key for j in waiting]} wait for jobs that never run")
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.poll_s)
                self._show_running(board, log_dir, inflight.values())
                for where_ref in ready:
                    job = inflight.pop(where_ref)
                    try:
                        where = ray.get(where_ref)
                        result = ray.get(refs[job.key])
                    except Exception as err:         # noqa: BLE001 - every failure becomes one line
                        self._collect_logs(log_dir, job)
                        message = self._failure(job, err, log_dir)
                        board.set(job.key, FAILED, error=message)
                        raise UserError(message) from None
                    results[job.key] = result
                    job.done(result, results)
                    self._collect_logs(log_dir, job)
                    board.set(job.key, DONE, host=where["host"], attempt=where["attempt"], seconds=where["seconds"])
        except BaseException:
            for ref in inflight:
                with contextlib.suppress(Exception):
                    ray.cancel(refs[inflight[ref].key], force=True)
            self.shutdown()
            raise
        finally:
            with contextlib.suppress(OSError):
                marker.unlink()
        return results

    def _show_running(self, board: Board, log_dir: Path, jobs) -> None:
        """Mark the in-flight jobs whose newest attempt has started (its log's first line) as running there."""
        for job in jobs:
            head = _newest_log_head(log_dir, slug(job.key))
            cell = board.cells[job.key]
            if head and (cell.state, cell.host, cell.attempt) != (RUNNING, head["host"], head["attempt"]):
                board.set(job.key, RUNNING, host=head["host"], attempt=head["attempt"])

    def _collect_logs(self, log_dir: Path, job: Job) -> None:
        """Copy the job's attempts' logs into the run folder's logs/ (the driver writes the run folder)."""
        if self.logs_to is None:
            return
        self.logs_to.mkdir(parents=True, exist_ok=True)
        for log in sorted(log_dir.glob(f"{slug(job.key)}.*.log")):
            shutil.copyfile(log, self.logs_to / log.name)

    def _failure(self, job: Job, err: BaseException, log_dir: Path) -> str:
        """The one line a failed job gives: its own ``UserError``'s message, or what Ray says was lost."""
        ray = _import_ray()
        cause = getattr(err, "cause", None) if isinstance(err, ray.exceptions.RayTaskError) else None
        if isinstance(cause, UserError):
            return f"{job.key}: {cause}"
        logs = f"{self.logs_to or log_dir}/{slug(job.key)}.<attempt>.log"
        if cause is not None:
            return f"{job.key} failed: {type(cause).__name__}: {first_line(cause)} (traceback in {logs})"
        return (f"{job.key} failed after {self.max_retries + 1} attempt(s): {type(err).__name__}: {first_line(err)} "
                f"(logs: {logs}); re-run the same command to resume, finished cells are kept")

    # -------------------------------------------------------------------------------------- timing

    @contextlib.contextmanager
    def quiet_host(self) -> Iterator[dict]:
        """While the runner times: no Ray on this machine if this driver started it; on a cluster, every CPU
        of the driver's node held by a placeholder actor (it waits for the node's running tasks to end).
        Yields what env.json records of it."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized() or self._started:
            self.shutdown()
            yield {"executor": self.name, "ray_during_timing": "stopped"}
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        cpus = next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node and n["Alive"]), 0)
        holder = None
        if cpus:
            holder = ray.remote(_Placeholder).options(num_cpus=cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(
                node, soft=False)).remote()
            ray.get(holder.ready.remote())
        try:
            yield {"executor": self.name, "ray_during_timing": f"connected; {cpus:g} CPUs of this node held"}
        finally:
            if holder is not None:
                ray.kill(holder)
            self.shutdown()


def _newest_log_head(log_dir: Path, name: str) -> dict | None:
    logs = sorted(log_dir.glob(f"{name}.*.log"), key=lambda p: int(p.name.rsplit(".", 2)[1]))
    if not logs:
        return None
    try:
        with open(logs[-1], encoding="utf-8") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        return None


def _describe(ray) -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
    return f"{len(nodes)} node(s), {cpus:g} CPUs"


class _Placeholder:
    """An actor that only holds CPUs (``quiet_host``)."""

    def ready(self) -> bool:
        return True
