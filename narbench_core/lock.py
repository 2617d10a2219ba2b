"""Who may write a folder, and which narbench processes are busy on this machine.

- ``hold(folder, what, wait=False)``: hold ``folder`` (a run folder, a training checkpoint) for this
  process. The lock is the file ``<folder>/.narbench.lock`` holding the holder's host, pid, process start
  and since when. It is created whole and atomically by hard-linking a written temp file to that name
  (``link`` fails if the name exists, also over NFS, where ``O_EXCL`` was not always atomic), so it
  survives ``kill -9`` as a stale file.
- The lock is a lease: while a folder is held, a daemon thread of the holder refreshes the lock file's
  mtime every ``defaults.LEASE_HEARTBEAT_S`` seconds (``refresh``), as long as the file names this
  process. A lock is stale, and taken over with one stderr line naming the old holder, when its holder
  is a dead process on this host (the pid is gone, a zombie, or now a different process; whatever the
  mtime), or, for a lock from another host (whose pid cannot be checked from here), when its heartbeat
  is older than ``defaults.LEASE_STALE_S`` (the hosts' clocks must agree to well within that). A
  takeover renames the stale file aside (one taker wins) and puts back what it moved if that was no
  longer the stale lock. A live holder of this host, or a fresh one of another host, is respected: a
  second process gets a ``Locked`` error, one line naming the holder (exit code 2 in the CLI), or with
  ``wait=True`` says once on stderr that it waits and looks again every ``defaults.LEASE_POLL_S``
  seconds until the lock is released or stale, then holds the folder. The same process may hold a
  folder again (nested holds count and share the heartbeat); the lock is removed, and its heartbeat
  stopped, when the outermost hold ends.
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
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from narbench_core import defaults
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


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (``kill -STOP``, Ctrl-Z; a tracing stop): it takes no CPU until continued."""
    return _state(pid) in ("T", "t")


def _instance(pid: int) -> str | None:
    """The boot id and start time (clock ticks since boot) of ``pid``: equal only for the same process."""
    fields = _stat_fields(pid)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{fields[19]}" if fields and len(fields) > 19 else None


# ------------------------------------------------------------------------------------------ folder locks

_now = time.time            # the clock a foreign lock's heartbeat age is read against (tests replace it)
_pause = time.sleep         # how a waiting ``acquire`` waits between looks (tests replace it)

_held: dict[Path, list] = {}         # lock file -> [Holder, depth, _Heartbeat] of this process's holds
_held_guard = threading.Lock()


def read_holder(folder: str | os.PathLike) -> Holder | None:
    """The holder recorded in ``folder``'s lock file (None: no lock, or an unreadable one)."""
    try:
        return Holder.load((Path(folder) / LOCK_FILE).read_text(encoding="utf-8"))
    except OSError:
        return None


def _read_lock(path: Path) -> tuple[Holder | None, float | None] | None:
    """The holder in the lock file ``path`` (None: unreadable) and the file's mtime, read from one open
    (which revalidates NFS's cached attributes); None when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            return Holder.load(f.read()), os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        return None, None


def refresh(folder: str | os.PathLike, holder: Holder) -> bool:
    """Renew ``holder``'s lease of ``folder``: set its lock file's mtime to now, if the file still names
    that process; False if it does not (taken over or removed). A passing file-system error counts as
    renewed: the next heartbeat tries again."""
    path = Path(folder) / LOCK_FILE
    try:
        on_disk = Holder.load(path.read_text(encoding="utf-8"))
        if on_disk is None or not on_disk.same_process(holder):
            return False
        os.utime(path)
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return True


class _Heartbeat:
    """The daemon thread that calls ``refresh`` for one held folder every ``interval`` seconds until
    ``stop``, or until the lock no longer names this process (said once on stderr)."""

    def __init__(self, folder: Path, holder: Holder, interval: float):
        self.folder, self.holder, self.interval = folder, holder, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"narbench lease {folder}", daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            if not refresh(self.folder, self.holder):
                if not self.stopped.is_set():
                    now = read_holder(self.folder)
                    print(f"narbench: {self.folder}: its lock no longer names this process "
                          f"({'now ' + now.describe() if now else 'removed'}); stopped refreshing it",
                          file=sys.stderr)
                return

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join()


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
    """One stale-lock takeover at a time on this host (across hosts, ``_take_over``'s rename decides)."""
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


def _stale(holder: Holder, mtime: float) -> str | None:
    """Why ``holder``'s lock may be taken over (None: it is live). This host's: its process is gone,
    whatever the mtime; another host's: its heartbeat (the mtime) is older than ``LEASE_STALE_S``."""
    if holder.host == socket.gethostname():
        return None if holder.alive() else "that process is gone"
    age = _now() - mtime
    return f"no heartbeat for {int(age)} s" if age > defaults.LEASE_STALE_S else None


def _take_over(folder: Path, stale: Holder) -> bool:
    """Remove the lock file if it is still ``stale``'s; whether this call removed it. The file is renamed
    aside (atomic: of several takers of one stale lock, one moves it); what was moved is put back if it
    was no longer ``stale``'s lock (another taker's new one)."""
    path = folder / LOCK_FILE
    aside = path.with_name(f"{path.name}.stale.{uuid.uuid4().hex[:8]}")
    with _takeover_guard():
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        try:
            moved = Holder.load(aside.read_text(encoding="utf-8"))
            if moved == stale:
                return True
            with contextlib.suppress(OSError):  # exists again: a third process holds it now
                os.link(aside, path)
            return False
        finally:
            aside.unlink()


def _refusal(folder: Path, holder: Holder | None, mtime: float | None) -> Locked:
    lock = folder / LOCK_FILE
    if holder is None:
        return Locked(f"{folder} is locked by an unreadable {lock}; if no narbench process uses that folder, "
                      "delete the file and re-run")
    if holder.host == socket.gethostname():
        return Locked(f"{folder} is in use by {holder.describe()}; wait for it to finish (or stop it), "
                      "then re-run")
    return Locked(f"{folder} is in use by {holder.describe()}, last heartbeat {max(0, int(_now() - mtime))} s "
                  f"ago; wait for it to finish (a lock without a heartbeat for {defaults.LEASE_STALE_S} s is "
                  f"taken over), or if that process is gone, delete {lock} and re-run")


def _register(key: Path, folder: Path, me: Holder) -> None:
    """Record this process's new hold of ``folder`` and start its heartbeat."""
    beat = _Heartbeat(folder, me, defaults.LEASE_HEARTBEAT_S)
    with _held_guard:
        old = _held.get(key)                # a hold of this process whose lock was taken over meanwhile
        _held[key] = [me, 1, beat]
    if old is not None:
        old[2].stop()
    beat.thread.start()


def acquire(folder: str | os.PathLike, what: str, wait: bool = False) -> Holder:
    """Lock ``folder`` for this process (see the module's doc). A live holder (this host's) or a fresh
    one (another host's): raises ``Locked`` naming it, or with ``wait`` says so once on stderr and looks
    again every ``defaults.LEASE_POLL_S`` seconds until the lock is released or stale."""
    folder = Path(folder)
    path = folder / LOCK_FILE
    key = path.absolute()
    with _held_guard:
        if key in _held and (on_disk := read_holder(folder)) is not None and on_disk.same_process(_held[key][0]):
            _held[key][1] += 1
            return _held[key][0]
    me = Holder.me(what)
    waiting, rounds = False, 0
    while True:                             # each round: create, or judge the holder: take over, refuse or wait
        if _create(path, me):
            _register(key, folder, me)
            return me
        found = _read_lock(path)
        if found is not None:               # (else released meanwhile)
            holder, mtime = found
            if holder is None:
                raise _refusal(folder, None, None)
            why = None if holder.same_process(me) else _stale(holder, mtime)
            if holder.same_process(me) or why is not None:
                if _take_over(folder, holder) and why:
                    print(f"narbench: {folder}: took over the lease of narbench pid {holder.pid} on "
                          f"{holder.host} ({why})", file=sys.stderr)
            elif not wait:
                raise _refusal(folder, holder, mtime)
            else:
                if not waiting:
                    print(f"narbench: waiting for {folder}: in use by {holder.describe()}", file=sys.stderr)
                waiting, rounds = True, 0
                _pause(defaults.LEASE_POLL_S)
                continue
        rounds += 1
        if rounds >= 20:                    # created and taken over by others in turn all along
            found = _read_lock(path) or (None, None)
            raise _refusal(folder, found[0], found[1])


def release(folder: str | os.PathLike) -> None:
    """End one hold of ``folder``; the outermost stops its heartbeat and removes the lock file (if it is
    still this process's)."""
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
    entry[2].stop()
    on_disk = read_holder(folder)
    if on_disk is not None and on_disk.same_process(entry[0]):
        with contextlib.suppress(FileNotFoundError):
            (folder / LOCK_FILE).unlink()


@contextlib.contextmanager
def hold(folder: str | os.PathLike, what: str, wait: bool = False) -> Iterator[Holder]:
    """Hold ``folder`` while the block runs (``acquire`` ... ``release``)."""
    holder = acquire(folder, what, wait)
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


def others(stopped_too: bool = True) -> list[Holder]:
    """The other processes of this host registered as busy and still alive (oldest first), without the stopped
    ones (``stopped``: they take no CPU) unless ``stopped_too``; the entries of dead processes of this host are
    removed."""
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
            if stopped_too or not stopped(holder.pid):
                found.append(holder)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return sorted(found, key=lambda h: h.since)
