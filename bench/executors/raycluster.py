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
- Timing stays on one machine (``quiet_host``): the driver's, once the Ray instance it started is
  stopped; on a cluster, a node offering the ``narbench_timing`` resource if there is one (each
  evaluation group is a Ray task there; its CPU must be the one the run has timed on), else the driver's
  node. A placeholder actor holds every CPU of that node while it times, so no training lands there.
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

from bench.executors.base import DONE, FAILED, RUNNING, Board, Job, TimingHost, check_order, first_line, this_host
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
        print(json.dumps({"job": key, **where}), flush=True)      # the first line: the driver reads where it runs
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
    _started: bool = False                            # this driver started the Ray instance
    _session: "_Session | None" = None

    # ---------------------------------------------------------------------------------- connection

    def _connect(self) -> "_Session":
        """Join (or start) Ray, write the data root's marker: what every job of this driver gets."""
        if self._session is not None:
            return self._session
        ray = _import_ray()
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
        from narbench_core.io import write_text
        from narbench_core.paths import subdir

        token = uuid.uuid4().hex
        marker = subdir(RAY_DIR) / f"{MARKER_PREFIX}{token}"
        write_text(marker, token + "\n")
        env = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV)}
        env["NARBENCH_DATA"] = str(marker.parents[1].absolute())
        self._session = _Session(token, marker, env, subdir(RAY_DIR) / "logs" / self.run_id)
        return self._session

    def shutdown(self) -> None:
        """Leave Ray (stopping it if this driver started it) and remove the marker."""
        if self._session is not None:
            with contextlib.suppress(OSError):
                self._session.marker.unlink()
            self._session = None
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()

    def _task(self, **options: Any):
        ray = _import_ray()
        return ray.remote(max_calls=1)(run_job).options(max_retries=self.max_retries, retry_exceptions=False,
                                                        num_returns=2, **options)

    def _submit(self, task, key: str, call: Callable, needs: list) -> tuple[Any, Any]:
        ray = _import_ray()
        s = self._connect()
        return task.remote(s.token, s.env, str(s.log_dir), key, ray.cloudpickle.dumps(call), *needs)

    # ----------------------------------------------------------------------------------------- run

    def run(self, jobs: list[Job], board: Board) -> dict[str, Any]:
        check_order(jobs)
        board.add(jobs)
        if not jobs:
            return {}
        session = self._connect()
        ray = _import_ray()
        task = self._task(num_cpus=self.cpus_per_job)
        results: dict[str, Any] = {}
        refs: dict[str, Any] = {}               # job key -> object ref of its result (what its dependents get)
        inflight: dict[Any, Job] = {}           # object ref of (where it ran) -> job
        waiting = list(jobs)
        try:
            while waiting or inflight:
                for job in [j for j in waiting if all(k in results for k in j.after) and all(k in refs for k in j.needs)]:
                    refs[job.key], where_ref = self._submit(task, job.key, job.build(results),
                                                            [refs[k] for k in job.needs])
                    inflight[where_ref] = job
                    waiting.remove(job)
                if not inflight:
                    raise RuntimeError(f"jobs {[j.key for j in waiting]} wait for jobs that never run")
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.poll_s)
                self._show_running(board, session.log_dir, inflight.values())
                for where_ref in ready:
                    job = inflight.pop(where_ref)
                    try:
                        where = ray.get(where_ref)
                        result = ray.get(refs[job.key])
                    except Exception as err:         # noqa: BLE001 - every failure becomes one line
                        self._collect_logs(job.key)
                        message = self._failure(job.key, err)
                        board.set(job.key, FAILED, error=message)
                        raise UserError(message) from None
                    results[job.key] = result
                    job.done(result, results)
                    self._collect_logs(job.key)
                    board.set(job.key, DONE, host=where["host"], attempt=where["attempt"], seconds=where["seconds"])
        except BaseException:
            for ref in inflight:
                with contextlib.suppress(Exception):
                    ray.cancel(refs[inflight[ref].key], force=True)
            self.shutdown()
            raise
        return results

    def _show_running(self, board: Board, log_dir: Path, jobs) -> None:
        """Mark the in-flight jobs whose newest attempt has started (its log, one listing of the folder per
        poll; a new attempt's first line says where) as running there."""
        newest: dict[str, int] = {}
        for name in os.listdir(log_dir) if log_dir.is_dir() else ():
            job, _, attempt = name.removesuffix(".log").rpartition(".")
            if attempt.isdigit():
                newest[job] = max(newest.get(job, 0), int(attempt))
        for job in jobs:
            name, cell = slug(job.key), board.cells[job.key]
            attempt = newest.get(name)
            if attempt is None or (cell.state, cell.attempt) == (RUNNING, attempt):
                continue
            head = _log_head(log_dir / f"{name}.{attempt}.log")
            if head:
                board.set(job.key, RUNNING, host=head["host"], attempt=attempt)

    def _collect_logs(self, key: str) -> None:
        """Copy the job's attempts' logs into the run folder's logs/ (the driver writes the run folder)."""
        if self.logs_to is None or self._session is None:
            return
        self.logs_to.mkdir(parents=True, exist_ok=True)
        for log in sorted(self._session.log_dir.glob(f"{slug(key)}.*.log")):
            shutil.copyfile(log, self.logs_to / log.name)

    def _failure(self, key: str, err: BaseException) -> str:
        """The one line a failed job gives: its own ``UserError``'s message, or what Ray says was lost."""
        ray = _import_ray()
        cause = getattr(err, "cause", None) if isinstance(err, ray.exceptions.RayTaskError) else None
        if isinstance(cause, UserError):
            return f"{key}: {cause}"
        logs = f"{self.logs_to or (self._session.log_dir if self._session else RAY_DIR)}/{slug(key)}.<attempt>.log"
        if cause is not None:
            return f"{key} failed: {type(cause).__name__}: {first_line(cause)} (traceback in {logs})"
        return (f"{key} failed after {self.max_retries + 1} attempt(s): {type(err).__name__}: {first_line(err)} "
                f"(logs: {logs}); re-run the same command to resume, finished cells are kept")

    # -------------------------------------------------------------------------------------- timing

    @contextlib.contextmanager
    def quiet_host(self) -> Iterator[TimingHost]:
        """Where the runner times, with no training there meanwhile:
        - Ray started by this driver: stopped; the driver times.
        - a cluster with a node offering the ``narbench_timing`` resource: that node times (each evaluation
          group a Ray task there), every CPU it offers held by a placeholder actor meanwhile;
        - another cluster: the driver times, every CPU of its own node held by a placeholder meanwhile."""
        if self.address is not None:
            self._connect()                 # (nothing to train: it has not joined yet) its timing node, if any
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized() or self._started:
            self.shutdown()
            yield TimingHost(this_host(), {"executor": self.name, "ray_during_timing": "stopped"})
            return
        alive = [n for n in ray.nodes() if n["Alive"]]
        timing = [n for n in alive if n["Resources"].get(defaults.RAY_TIMING_RESOURCE)]
        node = timing[0] if timing else next((n for n in alive
                                              if n["NodeID"] == ray.get_runtime_context().get_node_id()), None)
        holder = self._hold_cpus(ray, node) if node is not None else None
        try:
            cpus = node["Resources"].get("CPU", 0) if node else 0
            if timing:
                info = {"executor": self.name, "timing_node": node["NodeID"], "timing_host": node["NodeManagerHostname"],
                        "ray_during_timing": f"{defaults.RAY_TIMING_RESOURCE} node; its {cpus:g} CPUs held"}
                task = self._task(num_cpus=0, resources={defaults.RAY_TIMING_RESOURCE: 1},
                                  scheduling_strategy=_on_node(node["NodeID"]))
                yield TimingHost(node["NodeManagerHostname"], info, remote=True,
                                 run=lambda key, call: self._run_there(task, key, call))
            else:
                yield TimingHost(this_host(), {"executor": self.name,
                                               "ray_during_timing": f"connected; this node's {cpus:g} CPUs held"})
        finally:
            if holder is not None:
                with contextlib.suppress(Exception):
                    ray.kill(holder)
            self.shutdown()

    def _hold_cpus(self, ray, node: dict):
        """A placeholder actor holding every CPU ``node`` offers (waits for the tasks running there), or None."""
        cpus = node["Resources"].get("CPU", 0)
        if not cpus:
            return None
        holder = ray.remote(_Placeholder).options(num_cpus=cpus, scheduling_strategy=_on_node(node["NodeID"])).remote()
        ray.get(holder.ready.remote())
        return holder

    def _run_there(self, task, key: str, call: Callable) -> Any:
        """Run ``call`` as a job on the timing node; its result (a failure: one ``UserError`` line)."""
        ray = _import_ray()
        result_ref, where_ref = self._submit(task, key, call, [])
        try:
            ray.get(where_ref)
            return ray.get(result_ref)
        except Exception as err:                      # noqa: BLE001 - every failure becomes one line
            raise UserError(self._failure(key, err)) from None
        finally:
            self._collect_logs(key)


@dataclass
class _Session:
    """What every job of one connected driver gets: the marker's token and file, the settings, the log folder."""
    token: str
    marker: Path
    env: dict[str, str]
    log_dir: Path


def _on_node(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def _log_head(log: Path) -> dict | None:
    """A job log's first line (where the attempt runs); None until it is written whole."""
    try:
        with open(log, encoding="utf-8") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        return None


def _describe(ray) -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
    timing = sum(1 for n in nodes if n["Resources"].get(defaults.RAY_TIMING_RESOURCE))
    return f"{len(nodes)} node(s), {cpus:g} CPUs" + (f", {timing} timing node(s)" if timing else "")


class _Placeholder:
    """An actor that only holds CPUs (``quiet_host``)."""

    def ready(self) -> bool:
        return True
