"""Who may write a folder, and which narbench processes are busy on this machine.

- ``hold(folder, what)``: hold ``folder`` (a run folder, a training checkpoint) for this process. The lock
  is the file ``<folder>/.narbench.lock`` holding the holder's host, pid, process start and since when.
  It is created whole and atomically by hard-linking a written temp file to that name (``link`` fails if
  the name exists, also over NFS, where ``O_EXCL`` was not always atomic), so it survives ``kill -9``
  as a stale file: a lock whose holder is a dead process on this host (the pid is gone, a zombie, or
  now a different process) is taken over; a lock from another host is respected (its liveness cannot be
  checked from here) until someone deletes the file, as the refusal says. A second holder gets a
  ``Locked`` error: one line naming the holder (exit code 2 in the CLI). The same process may hold a
  folder again (nested holds count); the lock is removed when the outermost hold ends.
- ``busy(what)``: register this process as busy (timing, training) under the data root's ``locks/``
  folder while the block runs; ``others()`` lists the other live registered processes of this host, so
  a timing run can say that another narbench competed for the machine.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import tempfile
import threading
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from narbench_core.errors import UserError
from narbench_core.runs import utc_now

LOCK_FILE = ".narbench.lock"
BUSY_DIR = "locks"          # under the data root: one JSON file per busy process


class Locked(UserError):
    """Another process holds the folder."""


@dataclass(frozen=True)
class Holder:
    """A process: where it runs, its pid, which process instance that pid is, what it does, since when."""

    host: str
    pid: int
    what: str
    since: str
    instance: str | None = None    # boot id + start time of the pid (Linux): tells a reused pid apart

    @classmethod
    def me(cls, what: str) -> "Holder":
        return cls(socket.gethostname(), os.getpid(), what, utc_now().isoformat(timespec="seconds"),
                   _instance(os.getpid()))

    @classmethod
    def load(cls, text: str) -> "Holder | None":
        try:
            data = json.loads(text)
            return cls(str(data["host"]), int(data["pid"]), str(data.get("what", "")), str(data.get("since", "?")),
                       data.get("instance"))
        except (ValueError, KeyError, TypeError):
            return None

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    def same_process(self, other: "Holder") -> bool:
        return (self.host, self.pid, self.instance) == (other.host, other.pid, other.instance)

    def alive(self) -> bool | None:
        """Whether the process runs: True or False on this host, None (unknown) on another."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:        # another user's process: it exists
            pass
        if _state(self.pid) == "Z":    # exited, not yet reaped
            return False
        now = _instance(self.pid)
        return not (self.instance and now and now != self.instance)

    def describe(self) -> str:
        return f"narbench pid {self.pid} on {self.host} ({self.what}) since {self.since}"


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (state first), or None off Linux."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _instance(pid: int) -> str | None:
    """The boot id and start time (clock ticks since boot) of ``pid``: equal only for the same process."""
    fields = _stat_fields(pid)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{fields[19]}" if fields and len(fields) > 19 else None


# ------------------------------------------------------------------------------------------ folder locks

_held: dict[Path, list] = {}         # lock file -> [Holder, depth] of this process's holds
_held_guard = threading.Lock()


def read_holder(folder: str | os.PathLike) -> Holder | None:
    """The holder recorded in ``folder``'s lock file (None: no lock, or an unreadable one)."""
    try:
        return Holder.load((Path(folder) / LOCK_FILE).read_text(encoding="utf-8"))
    except OSError:
        return None


def _create(path: Path, holder: Holder) -> bool:
    """Create the lock file holding ``holder``, whole; False if it exists."""
    tmp = path.with_name(f"{path.name}.{holder.host}.{holder.pid}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(holder.dumps())
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as err:
        if os.stat(tmp).st_nlink == 2:      # NFS: the link was made but its reply was lost
            return True
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        try:                                # a file system without hard links
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(holder.dumps())
        return True
    finally:
        os.unlink(tmp)


@contextlib.contextmanager
def _takeover_guard() -> Iterator[None]:
    """One stale-lock takeover at a time on this host (only this host's processes take a lock over)."""
    import fcntl

    uid = os.getuid() if hasattr(os, "getuid") else 0
    for name in ("narbench-lock-takeover", f"narbench-lock-takeover-{uid}"):   # shared, else this user's
        try:
            fd = os.open(Path(tempfile.gettempdir()) / name, os.O_RDONLY | os.O_CREAT, 0o644)
            break
        except OSError:
            continue
    else:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _refusal(folder: Path, holder: Holder | None, alive: bool | None) -> Locked:
    lock = folder / LOCK_FILE
    if holder is None:
        return Locked(f"{folder} is locked by an unreadable {lock}; if no narbench process uses that folder, "
                      "delete the file and re-run")
    if alive:
        return Locked(f"{folder} is in use by {holder.describe()}; wait for it to finish (or stop it), "
                      "then re-run")
    return Locked(f"{folder} is in use by {holder.describe()}; wait for it to finish, or if that process is "
                  f"gone, delete {lock} and re-run")


def acquire(folder: str | os.PathLike, what: str) -> Holder:
    """Lock ``folder`` for this process (see the module's doc); raises ``Locked`` naming the holder."""
    folder = Path(folder)
    path = folder / LOCK_FILE
    key = path.absolute()
    with _held_guard:
        if key in _held and (on_disk := read_holder(folder)) is not None and on_disk.same_process(_held[key][0]):
            _held[key][1] += 1
            return _held[key][0]
    me = Holder.me(what)
    for _ in range(20):                     # each round: create, or judge the holder and maybe take over
        if _create(path, me):
            with _held_guard:
                _held[key] = [me, 1]
            return me
        holder = read_holder(folder)
        if holder is None:
            if not path.exists():
                continue                    # released meanwhile
            raise _refusal(folder, None, None)
        alive = True if holder.same_process(me) else holder.alive()
        if alive is not False and not holder.same_process(me):
            raise _refusal(folder, holder, alive)
        with _takeover_guard():             # the holder is dead (or this process): replace its lock
            if read_holder(folder) == holder:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    raise _refusal(folder, read_holder(folder), None)


def release(folder: str | os.PathLike) -> None:
    """End one hold of ``folder``; the outermost removes the lock file (if it is still this process's)."""
    folder = Path(folder)
    key = (folder / LOCK_FILE).absolute()
    with _held_guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
    on_disk = read_holder(folder)
    if on_disk is not None and on_disk.same_process(entry[0]):
        with contextlib.suppress(FileNotFoundError):
            (folder / LOCK_FILE).unlink()


@contextlib.contextmanager
def hold(folder: str | os.PathLike, what: str) -> Iterator[Holder]:
    """Hold ``folder`` while the block runs (``acquire`` ... ``release``)."""
    holder = acquire(folder, what)
    try:
        yield holder
    finally:
        release(folder)


# ------------------------------------------------------------------------------------- busy processes

def _busy_dir() -> Path:
    from narbench_core.paths import subdir

    return subdir(BUSY_DIR)


@contextlib.contextmanager
def busy(what: str) -> Iterator[Holder]:
    """Register this process as doing ``what`` ("timing quick", "training checkpoints/x") while the block
    runs, for ``others()`` in other processes."""
    from narbench_core.io import write_text

    me = Holder.me(what)
    path = _busy_dir() / f"{me.host}-{me.pid}-{uuid.uuid4().hex[:8]}.json"
    write_text(path, me.dumps())
    try:
        yield me
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def others() -> list[Holder]:
    """The other processes of this host registered as busy and still alive (oldest first); the entries of
    dead processes of this host are removed."""
    found = []
    host, pid = socket.gethostname(), os.getpid()
    for path in sorted(_busy_dir().glob("*.json")):
        try:
            holder = Holder.load(path.read_text(encoding="utf-8"))
        except OSError:                      # removed meanwhile
            continue
        if holder is None or holder.host != host or holder.pid == pid:
            continue
        if holder.alive():
            found.append(holder)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return sorted(found, key=lambda h: h.since)
