"""Huge pages for training's large buffers: glibc's ``glibc.malloc.hugetlb=1`` tunable, set by the commands that train.

XLA on the CPU allocates a program's temporary buffer with malloc at every execution and frees it after; in a
training step of the ``mini`` or ``small`` model that buffer is 400-530 MB, which glibc serves with a fresh ``mmap``
and unmaps at ``free``. Every step then faults in and zeroes about 100,000 4-KiB pages: in a ``mini`` AR training
(2026-12-03, 2-core AMD EPYC Zen 4, glibc 2.36) 28% of the process's CPU time was the kernel's (``perf``), and the
``mmap``/``munmap`` pair alone took 30-40 ms a step. With the tunable glibc asks for transparent huge pages on those
maps (``madvise``), 512 times fewer faults: the median train step of ``mini`` at its batch shapes went from 563,
580, 519 ms to 418, 399, 405 ms (AR) and from 473, 500, 460 to 336, 383, 463 ms (PaDIR), three rounds interleaved.
Numerics are unchanged (the allocator places the same buffers elsewhere).

glibc reads its tunables once, when a process starts: so the commands that train (``run``, ``train``, ``continue``)
start themselves again with the tunable added (``restart``), and the restarted process gives the user's own
setting back to its environment at once, so the processes it starts (timing workers: measured exactly as before)
never inherit it. ``NARBENCH_HUGEPAGES=0`` turns this off; a ``glibc.malloc.hugetlb`` of the user's own is kept.
Ray workers start with their cluster's environment: set ``GLIBC_TUNABLES`` where the cluster is started.
"""
from __future__ import annotations

import itertools
import os
import platform
import sys
from collections.abc import Mapping

ENV = "GLIBC_TUNABLES"
TUNABLE = "glibc.malloc.hugetlb=1"
OFF = "NARBENCH_HUGEPAGES"                      # "0": never start again
_BEFORE = "NARBENCH_GLIBC_TUNABLES_BEFORE"      # in the restarted process: "" (the user had none) or "=" + theirs
MIN_GLIBC = (2, 35)                             # the first glibc with the hugetlb tunable (older ones ignore it)


def glibc_version() -> tuple[int, int] | None:
    """This interpreter's glibc as (major, minor); None where the C library is not glibc (macOS, musl)."""
    name, version = platform.libc_ver()
    if name != "glibc":
        return None
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def restart_env(environ: Mapping[str, str], glibc: tuple[int, int] | None) -> dict[str, str] | None:
    """The environment to start this program again with (the tunable added, the user's own value kept aside),
    or None to go on as it is: switched off, already restarted, no glibc that knows the tunable, or a
    ``glibc.malloc.hugetlb`` the user chose."""
    if environ.get(OFF) == "0" or _BEFORE in environ or glibc is None or glibc < MIN_GLIBC:
        return None
    own = environ.get(ENV)
    if own and "glibc.malloc.hugetlb" in own:
        return None
    return {**environ, ENV: f"{own}:{TUNABLE}" if own else TUNABLE, _BEFORE: "" if own is None else f"={own}"}


def give_back(environ: dict[str, str]) -> bool:
    """In a restarted process: put the user's own ``GLIBC_TUNABLES`` (or its absence) back into ``environ``,
    so that the processes started from here are started as the user would; True if this process was restarted."""
    if _BEFORE not in environ:
        return False
    before = environ.pop(_BEFORE)
    if before.startswith("="):
        environ[ENV] = before[1:]
    else:
        environ.pop(ENV, None)
    return True


def restart() -> None:
    """Start this program again with the tunable (``os.execve``: the same interpreter and arguments) unless
    ``restart_env`` says not to; in the restarted process, give the user's setting back and return."""
    if give_back(os.environ):
        return
    env = restart_env(os.environ, glibc_version())
    if env is None or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def started_with() -> str | None:
    """The ``GLIBC_TUNABLES`` this process started with (what glibc read), from ``/proc/self/environ``: later
    changes to ``os.environ`` do not show there. glibc 2.36 cuts the string up in place as it parses it (each
    ``:`` becomes a NUL), so the tunables after the first read as entries of their own: they are joined again.
    None where there were none, or no ``/proc``."""
    try:
        with open("/proc/self/environ", "rb") as file:
            entries = file.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for at, entry in enumerate(entries):
        if entry.startswith(f"{ENV}="):
            parts = [entry.split("=", 1)[1]]
            parts += itertools.takewhile(lambda part: part.startswith("glibc."), entries[at + 1:])
            return ":".join(parts)
    return None
