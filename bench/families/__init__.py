"""The registry of system families: the one list of what a suite can compare.

Built-in families load lazily from the modules named in ``BUILTIN``; another family registers itself
with ``register(family)`` (a test family does so in tests/). Adding a family is one module plus one
line here. The harness asks ``get(name)`` and never branches on a family's name.
"""
from __future__ import annotations

import importlib

from bench.families.base import Context, Family, System, TrainCell
from narbench_core.errors import UserError

BUILTIN = {                        # name -> module that registers it, in table order
    "ar": "bench.families.ar",
    "padir": "bench.families.padir",
    "ct2": "bench.families.ct2",
    "ort": "bench.families.ort",   # runs the padir family's systems: expands after it
}
BASELINE = "ar"                    # its greedy system is every speedup's baseline and the distillation teacher

_REGISTRY: dict[str, Family] = {}

__all__ = ["BASELINE", "BUILTIN", "Context", "check_installed", "Family", "System", "TrainCell", "all_families", "get",
           "load_decoder", "load_suite", "parse_suite", "register", "unregister"]


def register(family: Family) -> Family:
    """Add a family (a duplicate name is an error naming the one already there)."""
    if not family.name or family.name in ("train", "model", "tasks", "distill", "timing"):
        raise ValueError(f"a family needs a name that is not a spec section of its own, got {family.name!r}")
    if family.name in _REGISTRY and _REGISTRY[family.name] is not family:
        raise ValueError(f"family {family.name!r} is registered already ({type(_REGISTRY[family.name]).__name__})")
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_builtins() -> None:
    for module in BUILTIN.values():
        importlib.import_module(module)


def all_families() -> list[Family]:
    """Every family: the built-ins in ``BUILTIN`` order, then the registered ones."""
    _load_builtins()
    order = list(BUILTIN) + [n for n in _REGISTRY if n not in BUILTIN]
    return [_REGISTRY[n] for n in order]


def get(name: str) -> Family:
    _load_builtins()
    if name not in _REGISTRY:
        raise UserError(f"unknown system family {name!r}; known: {', '.join(f.name for f in all_families())}")
    return _REGISTRY[name]


def load_decoder(family: str, checkpoint_dir, spec: str, **options):
    """The family's decoder ``spec`` on a checkpoint: the factory a timing worker builds its system with
    (module-level, so it pickles by reference)."""
    return get(family).load_decoder(checkpoint_dir, spec, **options)


def check_installed(spec) -> None:
    """A one-line ``UserError`` naming the extra to install, for the first family of ``spec`` whose engine
    is missing (``Family.check_installed``), before anything trains."""
    for family in all_families():
        if spec.section(family.name) is not None:
            family.check_installed()
    if getattr(spec, "serving", None) is not None:
        from bench.serving.loadgen import require_loadgen

        require_loadgen()


def worker_group(family: str) -> str | None:
    """The timing worker a family's system shares (``bench.measure.workers.WorkerSpec.group``): the family's
    one, where its systems share one (``Family.shares_worker``); None: a worker of its own."""
    return family if get(family).shares_worker else None


def worker_processes(systems) -> int:
    """How many timing worker processes ``systems`` (``System``s timed together) start."""
    return len({worker_group(s.family) or s.name for s in systems})


def rank(name: str) -> int:
    """A family's position in tables."""
    return [f.name for f in all_families()].index(name)


def parse_suite(data: dict, source: str = "<spec>", base_dir=None):
    """``suites.spec.parse_spec`` with every registered family's section (own-data paths relative to
    ``base_dir``, default the working directory); the suite's own data tasks are registered."""
    from suites.spec import parse_spec

    return register_file_tasks(parse_spec(data, source, {f.name: f for f in all_families()}, base_dir=base_dir))


def load_suite(name_or_path):
    """``suites.spec.load_spec`` with every registered family's section; the suite's own data tasks
    are registered."""
    from suites.spec import load_spec

    return register_file_tasks(load_spec(name_or_path, {f.name: f for f in all_families()}))


def register_file_tasks(spec):
    """Register each ``[[tasks]]`` on the suite's own files as a seqio Task (built-ins already are), in this
    process; returns ``spec``."""
    for task in spec.tasks:
        if task.files is not None:
            from suites import tasks

            tasks.register_file_task(task.files)
    return spec
