"""Folder locks and the busy-process registry (narbench_core.lock), with real second processes."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from narbench_core import lock
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
