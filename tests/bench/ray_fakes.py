"""Fakes for the Ray executor's tests: a trainer and a distiller that run in Ray workers.

They write what they did under the data root (shared by every node of the test cluster, which runs on
this machine): a checkpoint folder named by a stable hash of its settings (so every process names it the
same), an event file per start and per end of a job (job, host pid, node, time), and they sleep
``NARBENCH_FAKE_TRAIN_S`` seconds (from the driver's environment: Ray passes ``NARBENCH_*`` to workers)
so that jobs overlap and a node can be removed while one runs. The decoders, text and records are
``grid_fakes``'s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import uuid
from pathlib import Path

from narbench_core.errors import UserError

SLEEP_ENV = "NARBENCH_FAKE_TRAIN_S"
FAIL_ENV = "NARBENCH_FAKE_FAIL"           # a training of this family raises a UserError


def _root() -> Path:
    from narbench_core.paths import data_root

    return data_root()


def _event(kind: str, job: str, **more) -> None:
    folder = _root() / "fake-events"
    folder.mkdir(parents=True, exist_ok=True)
    node = None
    try:
        import ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    record = {"kind": kind, "job": job, "pid": os.getpid(), "node": node, "time": time.time(), **more}
    name = f"{kind}-{uuid.uuid4().hex}.json"
    # Whole: the tests read events while jobs write them. The part file's name does not end in .json: a reader's
    # glob matched it (pathlib's * matches a leading dot) and it was renamed before the read (CI-like run, 2026-11-29).
    (folder / f".{name}.part").write_text(json.dumps(record))
    (folder / f".{name}.part").rename(folder / name)


def events(root: Path, kind: str | None = None) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((root / "fake-events").glob("*.json"))]
    return sorted((e for e in found if kind is None or e["kind"] == kind), key=lambda e: e["time"])


def checkpoint_name(task: str, model_config: dict, train_config: dict, init_from) -> str:
    key = json.dumps([task, model_config, train_config, None if init_from is None else Path(init_from).name],
                     sort_keys=True)
    return f"ckpt-{model_config['family']}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def train(task: str, model_config: dict, train_config: dict, progress: bool = True, init_from=None) -> Path:
    """Train (sleep), or return the finished folder of these settings, holding the folder's lease as the real
    trainer does (``models.train.train(wait_for_lease=True)``)."""
    from narbench_core import lock

    out = _root() / "fake-checkpoints" / checkpoint_name(task, model_config, train_config, init_from)
    if os.environ.get(FAIL_ENV) == model_config["family"]:
        raise UserError(f"fake {model_config['family']} training refused: set a smaller learning rate")
    out.mkdir(parents=True, exist_ok=True)
    with lock.hold(out, f"training {out.name}", wait=True):
        if (out / "narbench.json").is_file():
            return out
        _event("start", out.name)
        time.sleep(float(os.environ.get(SLEEP_ENV, "0")))
        meta = {"task": task, "distill": task.endswith("_distilled"), **model_config, "train_config": train_config,
                "init_from": None if init_from is None else str(init_from), "complete": True}
        tmp = out / f".narbench.json.{os.getpid()}"
        tmp.write_text(json.dumps(meta))
        tmp.rename(out / "narbench.json")
        _event("end", out.name)
    return out


def distill(teacher_dir, task: str, decoder: str = "beam:5", max_examples=None, *, seed: int = 0,
            progress: bool = True, **kwargs) -> tuple[str, dict]:
    assert (Path(teacher_dir) / "narbench.json").is_file(), "the teacher must be trained first"
    _event("start", f"distill-{Path(teacher_dir).name}")
    _event("end", f"distill-{Path(teacher_dir).name}")
    record = {"task": task, "seed": seed, "examples": max_examples or 100, "teacher_decoder": decoder,
              "teacher_bleu": 42.0, "length_ratio": 0.98, "sentences_per_second": 50.0, "seconds": 2.0}
    return f"{task}_distilled", record


def sleep_job(name: str, seconds: float, *needs: str) -> str:
    """A job that sleeps: its result is its needs' results and its name, joined by '>'."""
    _event("start", name)
    time.sleep(seconds)
    _event("end", name)
    return ">".join([*needs, name])


def together_job(name: str, parties: int, timeout_s: float) -> str:
    """A job that starts, then waits until ``parties`` jobs of its kind have started (a barrier): it ends
    only if that many run at the same time; else it raises after ``timeout_s``."""
    _event("start", name)
    deadline = time.monotonic() + timeout_s
    while sum(e["job"].startswith("together") for e in events(_root(), "start")) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: fewer than {parties} jobs ran at the same time")
        time.sleep(0.05)
    _event("end", name)
    return name


def refuse_job(message: str) -> None:
    """A job that counts its attempts (an event each) and raises a ``UserError``."""
    _event("start", "refuse")
    raise UserError(message)


def seed_machine_peaks(root: Path) -> None:
    """Made-up machine peaks in the data root ``root`` (``bench.costs.machine_peaks``' cache, under this machine's
    key), so a run's timing job reads them instead of measuring the machine (seconds per fresh data root, in a Ray
    worker on a busy core); no test here reads a peak."""
    from bench.costs.machine import MachinePeaks, machine_key
    from narbench_core.io import write_json

    key = machine_key()
    (root / "machine").mkdir(parents=True, exist_ok=True)
    write_json(root / "machine" / "peaks.json", {key: dataclasses.asdict(MachinePeaks(key, 1e11, 1e10, "x", 8, 8))})


def deps():
    """``grid_fakes.fake_deps`` with this module's trainer and distiller (which run in Ray workers) and text
    seeded by a stable hash (``grid_fakes``' ``hash()`` differs between processes): every driver process
    times the same sentences."""
    from grid_fakes import fake_deps, fake_text

    def load_text(task: str, split: str):
        return fake_text(30, seed=int(hashlib.sha1(f"{task}:{split}".encode()).hexdigest()[:6], 16) % 1000)

    return dataclasses.replace(fake_deps(_root() / "unused"), train=train, distill=distill, load_text=load_text)
