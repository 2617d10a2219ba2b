"""The environment every result row carries: device, CPU, threads, library versions, git commit, date, seeds;
the other narbench processes that were busy on the machine while a run timed (``concurrent_narbench``), and the
machine's load from any process before and during each timed measurement (``machine_load``)."""
from __future__ import annotations

import os
import platform as _platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

CONCURRENT = "concurrent_narbench"   # env.json: other narbench processes busy while this run timed
LOAD = "machine_load"                # env.json: the machine's load before and during each timed measurement
LIBRARIES = ("jax", "jaxlib", "flax", "tensorflow", "sacrebleu", "numpy", "optax", "seqio", "sentencepiece",
             "mlcommons-loadgen")
REPO_DIR = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "unknown"


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")    # the extensions XLA's CPU kernels use


def cpu_details(cpuinfo: str | None = None, cache_root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, Any]:
    """What tells CPUs sold under one name apart (``/proc/cpuinfo`` names several Zen generations "AMD EPYC";
    one session's was family 25 model 1, a Zen 3 with AVX2 and 32 MiB L3): vendor, family, model, stepping,
    ISA extensions and cache sizes."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    first: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break                                           # the first processor's block only
        name, _, value = line.partition(":")
        first.setdefault(name.strip(), value.strip())
    flags = set(first.get("flags", "").split())
    caches = {}
    for index in sorted(cache_root.glob("index*")) if cache_root.is_dir() else []:
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        caches[f"L{level}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''}"] = size
    return {"vendor": first.get("vendor_id"), "family": first.get("cpu family"), "model": first.get("model"),
            "stepping": first.get("stepping"), "isa": [f for f in ISA_FLAGS if f in flags], "caches": caches}


def cpu_signature() -> str:
    """``cpu_model`` with family/model and the ISA extensions: the key under which machine rates are cached."""
    d = cpu_details()
    return f"{cpu_model()} (family {d['family']} model {d['model']}; {' '.join(d['isa']) or 'no avx2'})"


def thread_count() -> int:
    """CPUs this process may run on (affinity mask), which is what XLA's thread pool uses."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def core_count() -> int:
    """Physical cores (distinct (package, core id) pairs in /proc/cpuinfo), else the logical count."""
    try:
        cores, package = set(), "0"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("physical id"):
                package = line.split(":", 1)[1].strip()
            elif line.startswith("core id"):
                cores.add((package, line.split(":", 1)[1].strip()))
        if cores:
            return len(cores)
    except OSError:
        pass
    return os.cpu_count() or 1


def versions(names=LIBRARIES) -> dict[str, str | None]:
    """Installed distribution versions (None when not installed); nothing is imported."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(repo_dir: Path = REPO_DIR) -> dict[str, Any]:
    """Commit hash and dirty flag (read-only git calls); None values outside a git checkout.

    The flag says whether the code differs from the commit: untracked files and the committed result
    pages under results/ (outputs that runs rewrite, e.g. a `latest` pointer) do not count."""
    def _git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return {"commit": commit.strip(), "dirty": bool(status.strip()) if status is not None else None}


def device_info(platform: str | None = None) -> dict[str, Any]:
    """The JAX platform and its first device: kind and count; on an accelerator also what JAX says of it
    (``device``: SMs or cores, compute capability, memory) and ``device_driver`` (:func:`describe_device`)."""
    import jax

    backend = platform or jax.default_backend()
    devices = jax.devices(backend)
    info = {"platform": backend, "device_kind": devices[0].device_kind, "device_count": len(devices)}
    if backend != "cpu":
        info.update(describe_device(devices[0], nvidia_driver() if backend in ("gpu", "cuda") else None))
    return info


def describe_device(device: Any, driver: str | None) -> dict[str, Any]:
    """An accelerator's facts as JAX exposes them (each only where the device has it) and its driver line:
    the NVIDIA driver's version (``driver``) and the runtime JAX's backend reports (``platform_version``)."""
    facts: dict[str, Any] = {}
    for name in ("core_count", "compute_capability"):
        value = getattr(device, name, None)
        if value is not None:
            facts[name] = value if isinstance(value, (int, float)) else str(value)
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001 - not every backend keeps memory statistics
        limit = None
    if limit:
        facts["memory_bytes"] = int(limit)
    runtime = getattr(getattr(device, "client", None), "platform_version", None)
    parts = [f"driver {driver}" if driver else None, str(runtime).strip() if runtime else None]
    return {"device": facts, "device_driver": "; ".join(p for p in parts if p) or None}


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``), or None where there is no nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return lines[0].strip() if lines else None


def capture(seeds: Mapping[str, int] | None = None, platform: str | None = None,
            repo_dir: Path = REPO_DIR) -> dict[str, Any]:
    """The ``env.json`` object (JSON-serialisable)."""
    return {
        **device_info(platform),
        "cpu_model": cpu_model(),
        "cpu_signature": cpu_signature(),
        "cpu": cpu_details(),
        "threads": thread_count(),
        "cores": core_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "versions": versions(),
        "python": sys.version.split()[0],
        "git": git_state(repo_dir),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seeds": dict(seeds or {}),
    }


def timed_on(env: Mapping[str, Any]) -> str:
    """Where a run's latencies were measured, as its env.json says: the CPU (its signature, or its model in
    runs from before the signature), and on an accelerator the device's platform and kind."""
    cpu = env.get("cpu_signature") or env.get("cpu_model") or "an unknown CPU"
    platform, kind = _device(env)
    return cpu if platform == "cpu" else f"{kind or platform} ({platform}) on {cpu}"


def _device(env: Mapping[str, Any]) -> tuple[str, str | None]:
    """(platform, device kind) of an env.json; runs from before the platform field were timed on a CPU."""
    platform = env.get("platform") or "cpu"
    return platform, None if platform == "cpu" else env.get("device_kind")


def same_cpu(stored: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether two env.json records name one CPU: by ``cpu_signature`` (family, model, ISA) where both have it,
    else by model name (runs from before the signature). Cloud VMs name several generations alike ("Intel(R)
    Xeon(R) Processor": family 6 models 167 and 207 in this project's runs), so the name alone may join two."""
    key = "cpu_signature" if stored.get("cpu_signature") and now.get("cpu_signature") else "cpu_model"
    return stored.get(key) == now.get(key)


def check_same_machine(stored: Mapping[str, Any], now: Mapping[str, Any], timed: bool,
                       fix: str = "resume it on that machine, or start a new run with --force") -> None:
    """Refuse (one line) to go on timing a run on another machine than the one it has timed on: another CPU,
    or another device (a GPU run resumed on a CPU, an H100's on an H200): latencies and speedups of one run
    are compared with each other. ``timed``: the run has rows already; ``fix``: what the error line tells the
    user to do. The driver's version is not compared (it is recorded in every row)."""
    from narbench_core.errors import UserError

    if not timed or not (stored.get("cpu_signature") or stored.get("cpu_model")) or (
            same_cpu(stored, now) and _device(stored) == _device(now)):
        return
    raise UserError(f"this run was timed on {timed_on(stored)} and this machine is {timed_on(now)}: latencies "
                    f"measured on two machines are not comparable; {fix}")


def concurrent(seen: Iterable[Any]) -> list[dict[str, Any]]:
    """``env.json``'s ``concurrent_narbench`` entries of ``narbench_core.lock.Holder``s seen (each once)."""
    out: list[dict[str, Any]] = []
    for h in seen:
        entry = {"host": h.host, "pid": h.pid, "what": h.what, "since": h.since}
        if entry not in out:
            out.append(entry)
    return out


def record_concurrent(env: dict[str, Any], entries: Sequence[dict[str, Any]], what: str) -> dict[str, Any]:
    """``env`` with ``entries`` added to its ``concurrent_narbench`` list; with any new entry, one warning line
    on stderr saying who competed with timing ``what``."""
    have = list(env.get(CONCURRENT, []))
    new = [e for e in entries if e not in have]
    if new:
        who = "; ".join(f"pid {e['pid']}: {e['what']} since {e['since']}" for e in new)
        print(f"narbench: warning: {len(new)} other narbench process(es) busy on this machine while timing {what} "
              f"({who}); its latencies may be slower than on an idle machine (env.json: {CONCURRENT})",
              file=sys.stderr)
    return {**env, CONCURRENT: have + new}


def record_load(env: dict[str, Any], machine: dict[str, Any], what: str) -> dict[str, Any]:
    """``env`` with ``machine`` (one timed split's load, ``bench.measure.load``) in its ``machine_load`` list; when
    other processes took more than ``defaults.BUSY_SHARE`` of the CPU before or during it, one warning line."""
    from narbench_core import defaults

    busy = [(when, machine[when]) for when in ("before", "during")
            if machine.get(when) and machine[when]["others"] > defaults.BUSY_SHARE]
    if busy:
        figures = ", ".join(f"{when} {s['others']:.0%} (load average {s['load_avg_1m']:g}, steal {s['steal']:.0%})"
                            for when, s in busy)
        print(f"narbench: warning: the machine was busy while timing {what} on {machine['split']}: processes that "
              f"are not this run's took {figures} of its CPU; its latencies may be slower than on an idle machine "
              f"(env.json: {LOAD})", file=sys.stderr)
    have = [m for m in env.get(LOAD, []) if m.get("split") != machine["split"]]
    return {**env, LOAD: have + [machine]}
