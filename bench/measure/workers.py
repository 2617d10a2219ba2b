"""The timed systems in worker processes apart from the driver, so systems of different engines never share
a process.

Systems loaded into one process can slow each other: their thread pools, allocators and caches are
shared, and an engine whose pool spin-waits after a call keeps the cores busy while the next system
runs. So ``Runner.evaluate`` starts *workers* (``python -m bench.measure.workers``: a fresh interpreter,
not a fork, that imports only what its decoders need), with the environment their family asks for
(``Family.worker_env``: thread counts, the OpenMP wait policy), set before any library loads. A system
has a worker of its own, unless its family's systems share one (``Family.shares_worker``: the JAX
families, whose decoders share one XLA runtime and take a model's parameters as arguments, so PaDIR
decoders of every T and every model of one size share one compiled refinement loop per shape): one
process per system, or per model, made the 78-system grid's workers need more memory than a 24 GB
machine has (docs/experiments.md).

The driver keeps the schedule (``bench.measure.timing.measure_systems``): it hands each batch to the system
whose turn it is and waits on its worker's pipe; the worker times that system's call with the one protocol
(``bench.measure.timing.time_call``) and sends back the outputs and timings. Idle workers block on their pipe
and compute nothing. A worker's stdout and stderr go to a log file of its own, never to the command's output;
it inherits the driver's environment (``TF_CPP_MIN_LOG_LEVEL`` too when the command is quiet:
``narbench_core.quiet``). A worker that dies gives a one-line ``UserError`` naming its system and the last
line it wrote to stderr that is not a library's log line; nothing of that timed group is saved, so
re-running the command resumes. Timing stops with one line, before memory runs out (``check_memory``),
when the workers leave less than ``MEMORY_FLOOR`` of the machine's memory free.

Messages are ``(op, system, args)`` tuples answered by ``("ok", value)`` or ``("error", system, kind, text)``;
the first message is the list of ``WorkerSpec``s, answered by their ``info``s.
"""
from __future__ import annotations

import os
import pickle
import resource
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.measure import timing
from bench.measure.decoder import truncated_sources
from narbench_core.errors import UserError
from narbench_core.quiet import is_library_log


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds one system's decoder: ``factory(*args, **kwargs)``. ``factory`` must pickle by
    reference (a module-level function, or an instance of a module-level class)."""

    name: str                                   # the system's name (error messages, the decoder's name)
    factory: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)     # environment variables set before the interpreter starts
    platform: str | None = None                 # JAX platform to time on (None: JAX's default)
    group: str | None = None                    # systems of one group (with one env and platform) share a
                                                # worker process (``Family.shares_worker``); None: one of its own


def _jax_cache_env() -> dict[str, str]:
    """The driver's persistent compilation cache settings (``narbench_core.paths.enable_compilation_cache``)
    as the environment variables JAX reads at import, so workers share the driver's cache (a driver that has not
    imported JAX has them in its environment already)."""
    from narbench_core.paths import JAX_CACHE_OPTIONS

    jax = sys.modules.get("jax")
    if jax is None or not getattr(jax.config, JAX_CACHE_OPTIONS[0]):
        return {}
    return {name.upper(): str(getattr(jax.config, name)) for name in JAX_CACHE_OPTIONS}


def _peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` (reset when a process execs; ``ru_maxrss`` is not,
    so a worker's would start at the driver's peak), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024                          # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # Linux: KiB


def meminfo_mb() -> tuple[float, float] | None:
    """The machine's ``(total, available)`` memory in MB (``/proc/meminfo``), None where it cannot say."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return int(fields["MemTotal"].split()[0]) / 1024, int(fields["MemAvailable"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(done: str) -> None:
    """Stop timing with one line before the workers exhaust the machine's memory (with no swap, the kernel
    then evicts every process's code pages and the timing crawls): less than ``MEMORY_FLOOR`` of the total
    is left after ``done`` (what the workers have loaded so far)."""
    info = meminfo_mb()
    if info is None:
        return
    total, available = info
    if available < MEMORY_FLOOR * total:
        raise UserError(f"timing stopped before memory ran out: {available:,.0f} of {total:,.0f} MB left after {done}; "
                        "time fewer systems at once (split the suite's systems over two runs with `exclude`)")


MEMORY_FLOOR = 0.05   # the share of the machine's memory the workers must leave free (check_memory)


def memory_maps(pid: int) -> tuple[int, int] | None:
    """``(maps, limit)``: the memory maps process ``pid`` holds and the kernel's limit per process
    (``vm.max_map_count``); None where Linux's /proc cannot say."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = sum(1 for _ in f)
        return maps, int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


class _Process:
    """One worker process and its pipe; it hosts one system or a group of them (``WorkerSpec.group``)."""

    def __init__(self, specs: Sequence[WorkerSpec], log_dir: Path):
        self.names = [s.name for s in specs]
        ours, theirs = socket.socketpair()
        self._log = Path(log_dir) / f"worker-{len(list(Path(log_dir).glob('worker-*')))}.log"
        # The driver's import path, so a factory that pickles by reference here unpickles there.
        path = os.pathsep.join([p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
        env = {**os.environ, "PYTHONPATH": path, **_jax_cache_env(), **{k: str(v) for k, v in specs[0].env.items()}}
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.measure.workers", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, close_fds=True,
                start_new_session=True)    # the driver alone stops its workers (Ctrl-C reaches only it)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send_bytes(pickle.dumps(list(specs)))
        self._infos: list[dict] = []
        self._maps_step = 0            # the most memory maps one warm-up added in this process so far

    def check_maps(self, done: str, before: int | None) -> None:
        """Stop with one line before the next warm-up could take this process past the kernel's memory-map
        limit (it would die of SIGSEGV): XLA maps each loaded executable's code in a few hundred maps, so a
        worker hosting many systems runs out of maps before memory (``before``: its maps before ``done``)."""
        now = memory_maps(self.pid)
        if now is None or before is None:
            return
        maps, limit = now
        self._maps_step = max(self._maps_step, maps - before)
        if maps + self._maps_step > limit:
            raise UserError(f"timing stopped: the worker process of {', '.join(self.names[:3])}"
                            f"{' ...' if len(self.names) > 3 else ''} holds {maps:,} memory maps after {done}, and "
                            f"the next warm-up could pass the kernel's limit of {limit:,}; raise it (sysctl -w "
                            "vm.max_map_count=262144) or time fewer systems at once")

    def maps(self) -> int | None:
        now = memory_maps(self.pid)
        return None if now is None else now[0]

    @property
    def pid(self) -> int:
        return self.process.pid

    def ready(self) -> list[dict]:
        """Wait until the worker has built its decoders; their infos (pid, threads, env, peak RSS, systems)."""
        if not self._infos:
            self._infos = self._reply(self.names[0])
        return self._infos

    def call(self, name: str, op: str, *args: Any) -> Any:
        self.ready()
        try:
            self._conn.send_bytes(pickle.dumps((op, name, args)))
        except OSError:
            self._died(name)
        return self._reply(name)

    def _reply(self, name: str) -> Any:
        try:
            message = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._died(name)
        if message[0] == "ok":
            return message[1]
        _, system, kind, text = message
        if kind == "UserError":
            raise UserError(f"{system}: {text}")
        raise RuntimeError(f"{system}: its worker failed: {kind}: {text}")

    def _died(self, name: str):
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        lines = [ln for ln in self._log.read_text(errors="replace").splitlines()
                 if ln.strip() and not is_library_log(ln)] if self._log.exists() else []
        last = f": {lines[-1].strip()[:300]}" if lines else ""
        shared = f", shared by {len(self.names)} systems" if len(self.names) > 1 else ""
        raise UserError(f"system {name}: its worker process (pid {self.pid}{shared}) died with exit code {code}"
                        f"{last}; re-run the same command to resume")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._conn.send_bytes(pickle.dumps(("stop", "", ())))
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._conn.close()


class Worker:
    """The driver's handle on one system in a worker process (a ``bench.measure.timing.TimedSystem``)."""

    def __init__(self, spec: WorkerSpec, process: _Process):
        self.spec, self.name, self._process = spec, spec.name, process

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def info(self) -> dict:
        """Where it runs: pid, engine threads, environment, the process's peak RSS when the decoders were
        built, and how many systems the process hosts (``systems``)."""
        return self._process.ready()[self._process.names.index(self.name)]

    def call(self, op: str, *args: Any) -> Any:
        return self._process.call(self.name, op, *args)

    # -- bench.measure.timing.TimedSystem ---------------------------------------------------------------------
    def warmup(self, batch_size: int) -> float:
        before = self._process.maps()
        seconds = self.call("warmup", batch_size)
        check_memory(f"warming up {self.name}")
        self._process.check_maps(f"warming up {self.name}", before)
        return seconds

    def timed(self, sources: list[str], phase: str):
        return self.call("timed", list(sources), phase)

    # -- more of what the runner asks ------------------------------------------------------------------
    def cost(self, sources: Sequence[str], passes, batch_size: int):
        """``bench.costs.cost_of`` of this worker's decoder (None for a decoder outside XLA)."""
        return self.call("cost", list(sources), passes, batch_size)

    def truncated(self, sources: Sequence[str]) -> int | None:
        """``bench.measure.decoder.truncated_sources`` of this worker's decoder."""
        return self.call("truncated", list(sources))

    def peak_rss_mb(self) -> float:
        """Its process's peak resident memory (shared by the systems the process hosts)."""
        return self.call("peak_rss_mb")


class WorkerPool:
    """The systems' worker processes, started together (they load in parallel) and stopped together: one
    per system, or per group of systems that may share one (``WorkerSpec.group`` with one env and platform).
    ``workers`` are the systems' handles in the order of ``specs``."""

    def __init__(self, specs: Sequence[WorkerSpec]):
        self._dir = tempfile.TemporaryDirectory(prefix="narbench-workers-")
        self.processes: list[_Process] = []
        try:
            groups: dict[Any, list[WorkerSpec]] = {}
            for i, spec in enumerate(specs):
                key = (spec.group, tuple(sorted(spec.env.items())), spec.platform) if spec.group else i
                groups.setdefault(key, []).append(spec)
            by_name = {}
            for members in groups.values():
                self.processes.append(_Process(members, Path(self._dir.name)))
                by_name.update({s.name: (s, self.processes[-1]) for s in members})
            for n, process in enumerate(self.processes, 1):
                process.ready()
                check_memory(f"loading {n} of {len(self.processes)} worker processes")
            self.workers = [Worker(*by_name[s.name]) for s in specs]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for p in self.processes:
            p.close()
        self._dir.cleanup()


class Local(timing.InProcess):
    """A decoder timed in the driver's own process (``[timing] isolate = false``, tests with fakes): the
    same calls as a ``Worker``."""

    def __init__(self, decoder: Any):
        super().__init__(decoder)
        self.info = _info(decoder, {})

    def cost(self, sources: Sequence[str], passes, batch_size: int):
        from bench.costs import cost_of

        return cost_of(self.decoder, list(sources), passes, batch_size)

    def truncated(self, sources: Sequence[str]) -> int | None:
        return truncated_sources(self.decoder, sources)

    def peak_rss_mb(self) -> float:
        return _peak_rss_mb()

    def close(self) -> None:
        pass


def _info(decoder: Any, env: dict) -> dict:
    """What a row and env.json say of where a system ran: its process, its engine's threads (the
    decoder's ``threads``, else every CPU this process may use, as XLA's pool does), its environment."""
    from bench.measure.env import thread_count

    return {"pid": os.getpid(), "threads": int(getattr(decoder, "threads", 0) or thread_count()),
            "env": dict(env), "peak_rss_mb": _peak_rss_mb()}


# ------------------------------------------------------------------------------------------ the worker

def _serve(conn: Connection) -> None:
    specs: list[WorkerSpec] = pickle.loads(conn.recv_bytes())

    decoders = {}
    for spec in specs:
        try:
            decoders[spec.name] = spec.factory(*spec.args, **spec.kwargs)
        except BaseException as e:       # noqa: BLE001 - the driver turns it into its one-line error
            conn.send_bytes(pickle.dumps(("error", spec.name, type(e).__name__, str(e))))
            return
    conn.send_bytes(pickle.dumps(("ok", [{**_info(decoders[s.name], s.env), "systems": len(specs)} for s in specs])))
    scope = timing._device_scope(specs[0].platform)

    def cost(decoder, sources, passes, batch_size):
        from bench.costs import cost_of

        return cost_of(decoder, sources, passes, batch_size)

    ops = {"warmup": lambda decoder, bs: timing.warm_up_decoder(decoder, bs),
           "timed": lambda decoder, sources, phase: timing.time_call(decoder, sources, phase),
           "cost": cost, "truncated": truncated_sources,
           "peak_rss_mb": lambda decoder: _peak_rss_mb()}
    with scope:
        while True:
            try:
                op, name, args = pickle.loads(conn.recv_bytes())
            except EOFError:
                return
            if op == "stop":
                return
            try:
                reply = ("ok", ops[op](decoders[name], *args))
            except BaseException as e:   # noqa: BLE001
                reply = ("error", name, type(e).__name__, str(e))
            conn.send_bytes(pickle.dumps(reply))


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[0]))
    try:
        _serve(conn)
    finally:
        conn.close()


if __name__ == "__main__":
    from bench.measure.workers import main as _main      # one copy of this module (pickles name bench.measure.workers)

    _main(sys.argv[1:])
