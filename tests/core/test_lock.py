"""Folder locks and the busy-process registry (narbench_core.lock), with real second processes."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from narbench_core import defaults, lock
from narbench_core.errors import UserError
from narbench_core.io import temp_dir


def test_a_second_process_is_refused_with_one_line_naming_the_holder(tmp_path, second_process):
    other = second_process("hold", tmp_path)
    with pytest.raises(lock.Locked) as err:
        lock.acquire(tmp_path, "test")
    text = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in text
    assert f"pid {other.pid} on {socket.gethostname()} (narbench run --suite test) since " in text
    assert str(tmp_path) in text and "wait for it to finish" in text
    other.stop()                                     # released on exit: the folder is free
    with lock.hold(tmp_path, "test") as me:
        assert lock.read_holder(tmp_path) == me and me.pid == os.getpid()
    assert not (tmp_path / lock.LOCK_FILE).exists()


def test_the_lock_of_a_process_killed_by_sigkill_is_taken_over(tmp_path, second_process):
    dead = second_process("die", tmp_path)
    assert dead.proc.returncode == -signal.SIGKILL
    assert lock.read_holder(tmp_path).pid == dead.pid          # its lock file survived the kill
    with lock.hold(tmp_path, "test") as me:
        assert lock.read_holder(tmp_path) == me


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    """The pid of the lock's process now runs another process (here: this one): the lock is stale."""
    me = lock.Holder.me("test")
    if me.instance is None:
        pytest.skip("no /proc: a reused pid cannot be told apart")
    old = lock.Holder(me.host, me.pid, "narbench run", "2020-01-01T00:00:00+00:00", "another-boot:1")
    (tmp_path / lock.LOCK_FILE).write_text(old.dumps())
    with lock.hold(tmp_path, "test") as holder:
        assert lock.read_holder(tmp_path) == holder != old


def test_a_lock_from_another_host_is_respected(tmp_path):
    other = lock.Holder("elsewhere.example", 1, "narbench run", "2020-01-01T00:00:00+00:00")
    (tmp_path / lock.LOCK_FILE).write_text(other.dumps())
    with pytest.raises(lock.Locked, match=f"pid 1 on elsewhere.example .* if that process is gone, delete "
                                          f"{tmp_path / lock.LOCK_FILE}"):
        lock.acquire(tmp_path, "test")
    assert lock.read_holder(tmp_path) == other


ELSEWHERE = lock.Holder("elsewhere.example", 1, "narbench run", "2020-01-01T00:00:00+00:00")


def foreign_lock(folder: Path, mtime: float) -> Path:
    """A lock of a process on another host whose last heartbeat was at ``mtime``."""
    path, tmp = folder / lock.LOCK_FILE, folder / "lock.tmp"
    tmp.write_text(ELSEWHERE.dumps())
    os.utime(tmp, (mtime, mtime))
    os.replace(tmp, path)                                         # whole, as narbench writes it
    return path


def test_a_fresh_lock_from_another_host_is_refused_saying_its_heartbeat_age(tmp_path, monkeypatch):
    path = foreign_lock(tmp_path, 1000.0)
    monkeypatch.setattr(lock, "_now", lambda: 1000.0 + defaults.LEASE_STALE_S)     # not older than the limit
    with pytest.raises(lock.Locked) as err:
        lock.acquire(tmp_path, "test")
    assert (f"pid 1 on elsewhere.example (narbench run) since 2020-01-01T00:00:00+00:00, last heartbeat "
            f"{defaults.LEASE_STALE_S} s ago; wait for it to finish (a lock without a heartbeat for "
            f"{defaults.LEASE_STALE_S} s is taken over)") in str(err.value)
    assert "\n" not in str(err.value) and lock.read_holder(tmp_path) == ELSEWHERE
    assert path.stat().st_mtime == 1000.0


def test_a_lock_from_another_host_without_a_heartbeat_is_taken_over_with_one_line(tmp_path, monkeypatch, capsys):
    foreign_lock(tmp_path, 1000.0)
    monkeypatch.setattr(lock, "_now", lambda: 1000.0 + defaults.LEASE_STALE_S + 1)
    with lock.hold(tmp_path, "test") as me:
        assert lock.read_holder(tmp_path) == me
    assert capsys.readouterr().err == (f"narbench: {tmp_path}: took over the lease of narbench pid 1 on "
                                       f"elsewhere.example (no heartbeat for {defaults.LEASE_STALE_S + 1} s)\n")
    assert [p.name for p in tmp_path.iterdir()] == []           # the stale file is not left aside


def test_a_lock_of_this_host_is_judged_by_its_process_whatever_its_mtime(tmp_path, second_process, monkeypatch,
                                                                          capsys):
    (tmp_path / "dead").mkdir()
    (tmp_path / "live").mkdir()
    dead = second_process("die", tmp_path / "dead")               # its lock's mtime: a moment ago
    with lock.hold(tmp_path / "dead", "test"):
        pass
    assert capsys.readouterr().err == (f"narbench: {tmp_path / 'dead'}: took over the lease of narbench pid "
                                       f"{dead.pid} on {socket.gethostname()} (that process is gone)\n")
    monkeypatch.setattr(lock, "_now", lambda: 1e12)               # every mtime looks ancient
    live = second_process("hold", tmp_path / "live")
    with pytest.raises(lock.Locked, match=f"pid {live.pid} on "):
        lock.acquire(tmp_path / "live", "test")
    assert lock.read_holder(tmp_path / "live").pid == live.pid and capsys.readouterr().err == ""


def heartbeat_threads(folder: Path) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"narbench lease {folder}"]


def test_the_heartbeat_refreshes_the_lease_while_held_and_stops_at_the_outermost_release(tmp_path, monkeypatch):
    monkeypatch.setattr(defaults, "LEASE_HEARTBEAT_S", 0.001)
    beats, beat, refresh = [], threading.Event(), lock.refresh

    def spy(folder, holder):
        beats.append(refresh(folder, holder))
        beat.set()
        return beats[-1]

    monkeypatch.setattr(lock, "refresh", spy)
    path = tmp_path / lock.LOCK_FILE
    with lock.hold(tmp_path, "outer"):
        os.utime(path, (1000.0, 1000.0))                          # as if the last beat were long ago
        while path.stat().st_mtime == 1000.0:
            assert beat.wait(10), "no heartbeat"
            beat.clear()
        assert path.stat().st_mtime > 1000.0 + defaults.LEASE_STALE_S and all(beats)
        with lock.hold(tmp_path, "inner"):
            assert len(heartbeat_threads(tmp_path)) == 1           # nested holds share it
        assert len(heartbeat_threads(tmp_path)) == 1
    assert heartbeat_threads(tmp_path) == [] and not path.exists()
    done = len(beats)
    assert refresh(tmp_path, lock.Holder.me("x")) is False and len(beats) == done   # no file: nothing renewed


def test_the_heartbeat_stops_and_says_so_when_the_lock_no_longer_names_this_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(defaults, "LEASE_HEARTBEAT_S", 0.001)
    replaced, refresh = threading.Event(), lock.refresh
    monkeypatch.setattr(lock, "refresh", lambda folder, holder: replaced.wait() and refresh(folder, holder))
    with lock.hold(tmp_path, "test"):
        (thread,) = heartbeat_threads(tmp_path)
        path = foreign_lock(tmp_path, 1000.0)                     # taken over by another host meanwhile
        replaced.set()
        thread.join(10)
        assert not thread.is_alive() and path.stat().st_mtime == 1000.0    # its lease is not renewed
    assert lock.read_holder(tmp_path) == ELSEWHERE                # nor removed at the release
    assert capsys.readouterr().err == (f"narbench: {tmp_path}: its lock no longer names this process (now "
                                       f"{ELSEWHERE.describe()}); stopped refreshing it\n")


def test_waiting_for_a_folder_another_process_holds_returns_holding_it_once_released(tmp_path, second_process,
                                                                                    monkeypatch, capsys):
    other = second_process("hold", tmp_path)
    with pytest.raises(lock.Locked):                              # not waiting: the default
        lock.acquire(tmp_path, "test")
    pauses = []
    monkeypatch.setattr(lock, "_pause", lambda s: pauses.append(s) or other.stop())   # it finishes meanwhile
    with lock.hold(tmp_path, "test", wait=True) as me:
        assert lock.read_holder(tmp_path) == me and me.pid == os.getpid()
    assert pauses == [defaults.LEASE_POLL_S] and not (tmp_path / lock.LOCK_FILE).exists()
    err = capsys.readouterr().err
    assert err.startswith(f"narbench: waiting for {tmp_path}: in use by narbench pid {other.pid} on "
                          f"{socket.gethostname()} (narbench run --suite test) since ") and err.count("\n") == 1


def test_waiting_for_a_lock_of_another_host_takes_it_over_once_its_heartbeat_is_stale(tmp_path, monkeypatch,
                                                                                      capsys):
    foreign_lock(tmp_path, 1000.0)
    clock = [1000.0]
    monkeypatch.setattr(lock, "_now", lambda: clock[0])
    monkeypatch.setattr(lock, "_pause", lambda s: clock.__setitem__(0, clock[0] + s))
    with lock.hold(tmp_path, "test", wait=True) as me:
        assert lock.read_holder(tmp_path) == me
    polls = defaults.LEASE_STALE_S // defaults.LEASE_POLL_S + 1   # the first look older than the limit
    assert clock[0] == 1000.0 + polls * defaults.LEASE_POLL_S
    assert capsys.readouterr().err == (
        f"narbench: waiting for {tmp_path}: in use by {ELSEWHERE.describe()}\n"
        f"narbench: {tmp_path}: took over the lease of narbench pid 1 on elsewhere.example "
        f"(no heartbeat for {polls * defaults.LEASE_POLL_S} s)\n")


def test_nested_holds_in_one_process_release_at_the_outermost(tmp_path):
    with lock.hold(tmp_path, "outer"):
        with lock.hold(tmp_path, "inner"):
            pass
        assert (tmp_path / lock.LOCK_FILE).exists()
    assert not (tmp_path / lock.LOCK_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == []           # no temp file left behind


def test_busy_processes_of_this_host_are_listed_while_alive(second_process):
    assert all(h.pid != os.getpid() for h in lock.others())
    other = second_process("busy", "training test-ar-1234")
    found = [h for h in lock.others() if h.pid == other.pid]
    assert [(h.what, h.host) for h in found] == [("training test-ar-1234", socket.gethostname())]
    with lock.busy("timing mine"):
        assert all(h.pid != os.getpid() for h in lock.others())   # never itself
    other.stop()
    assert all(h.pid != other.pid for h in lock.others())


def test_a_stopped_busy_process_is_listed_unless_only_running_ones_are_asked_for(second_process):
    """A training paused with SIGSTOP takes no CPU: ``others(stopped_too=False)`` (what a train-step probe asks) leaves
    it out; ``others()`` (what a timing run records) keeps it."""
    other = second_process("busy", "training test-ar-5678")
    os.kill(other.pid, signal.SIGSTOP)
    try:
        for _ in range(200):
            if lock.stopped(other.pid):
                break
            threading.Event().wait(0.01)
        assert [h.what for h in lock.others() if h.pid == other.pid] == ["training test-ar-5678"]
        assert all(h.pid != other.pid for h in lock.others(stopped_too=False))
    finally:
        os.kill(other.pid, signal.SIGCONT)
    for _ in range(200):
        if not lock.stopped(other.pid):
            break
        threading.Event().wait(0.01)
    assert [h.what for h in lock.others(stopped_too=False) if h.pid == other.pid] == ["training test-ar-5678"]


def test_a_stopped_process_is_told_apart_from_a_running_one():
    """``stopped``: a process paused with SIGSTOP (a training paused while something is timed) takes no CPU."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not lock.stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        for _ in range(200):                          # the kernel stops it asynchronously
            if lock.stopped(proc.pid):
                break
            threading.Event().wait(0.01)
        assert lock.stopped(proc.pid)
        proc.send_signal(signal.SIGCONT)
        for _ in range(200):
            if not lock.stopped(proc.pid):
                break
            threading.Event().wait(0.01)
        assert not lock.stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not lock.stopped(proc.pid)                 # gone: not stopped either


def test_the_entry_of_a_dead_busy_process_is_removed():
    entries = Path(os.environ["NARBENCH_DATA"]) / lock.BUSY_DIR
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()                                       # a pid that ran and is gone
    gone = lock.Holder(socket.gethostname(), proc.pid, "training x", "2020-01-01T00:00:00+00:00")
    entries.mkdir(parents=True, exist_ok=True)
    path = entries / f"{gone.host}-{gone.pid}-test.json"
    path.write_text(gone.dumps())
    assert all(h.pid != proc.pid for h in lock.others()) and not path.exists()


def test_temp_dir_honours_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        path = temp_dir(tmp_path, prefix="x.")
    finally:
        os.umask(old)
    assert path.parent == tmp_path and path.stat().st_mode & 0o777 == 0o750
