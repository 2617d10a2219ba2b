"""bench.measure.env: the environment captured with every run."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

from bench.measure import env


def test_capture_has_every_field_and_is_json():
    e = env.capture(seeds={"train": 0, "decode": 1})
    json.dumps(e)  # serialisable
    assert e["platform"] == "cpu" and e["device_kind"] and e["device_count"] >= 1
    assert e["threads"] >= 1 and e["cores"] >= 1 and e["cpu_model"]
    assert e["versions"]["jax"] == metadata.version("jax")
    assert e["versions"]["sacrebleu"] == metadata.version("sacrebleu")
    assert set(env.LIBRARIES) <= set(e["versions"])
    assert e["python"] == sys.version.split()[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", e["date_utc"])
    assert e["seeds"] == {"train": 0, "decode": 1}


def test_git_state_matches_git():
    state = env.git_state()
    head = subprocess.run(["git", "-C", str(env.REPO_DIR), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        assert state == {"commit": None, "dirty": None}
    else:
        assert state["commit"] == head.stdout.strip() and isinstance(state["dirty"], bool)


def test_git_state_dirty_means_code_changed_not_result_pages(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    (tmp_path / "results" / "default").mkdir(parents=True)
    (tmp_path / "results" / "default" / "latest").write_text("run1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "init")
    assert env.git_state(tmp_path)["dirty"] is False
    (tmp_path / "results" / "default" / "latest").write_text("run2\n")     # a run moved the pointer
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert env.git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert env.git_state(tmp_path)["dirty"] is True


def test_git_state_outside_a_repo(tmp_path):
    assert env.git_state(tmp_path) == {"commit": None, "dirty": None}


def test_cpu_model_matches_proc_cpuinfo():
    text = open("/proc/cpuinfo").read()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    assert env.cpu_model() == names[0]


def test_unknown_library_version_is_none():
    assert env.versions(("no-such-distribution-xyz",)) == {"no-such-distribution-xyz": None}


def test_cpu_details_tell_apart_cpus_sold_under_one_name(tmp_path):
    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
               "stepping\t: 1\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: avx512f\n")
    for i, (level, kind, size) in enumerate([("1", "Data", "32K"), ("2", "Unified", "512K"), ("3", "Unified", "32768K")]):
        folder = tmp_path / f"index{i}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(value + "\n")
    d = env.cpu_details(cpuinfo, tmp_path)
    assert (d["vendor"], d["family"], d["model"], d["stepping"]) == ("AuthenticAMD", "25", "1", "1")
    assert d["isa"] == ["avx2", "fma"]                         # the second processor's flags are not read
    assert d["caches"] == {"L1d": "32K", "L2": "512K", "L3": "32768K"}
    assert env.cpu_details("", tmp_path / "missing") == {"vendor": None, "family": None, "model": None,
                                                        "stepping": None, "isa": [], "caches": {}}


class _Client:
    platform_version = "cuda 13000"


class _Gpu:
    """What a JAX CUDA device exposes (device_kind aside)."""
    core_count, compute_capability, client = 132, "9.0", _Client()

    def memory_stats(self):
        return {"bytes_limit": 80 * 2**30, "bytes_in_use": 0}


class _Bare:
    """A device with none of it (memory_stats raises, as on some backends)."""

    def memory_stats(self):
        raise RuntimeError("not available")


def test_an_accelerator_is_described_by_what_jax_exposes_and_its_driver():
    facts = env.describe_device(_Gpu(), "580.65.06")
    assert facts == {"device": {"core_count": 132, "compute_capability": "9.0", "memory_bytes": 80 * 2**30},
                     "device_driver": "driver 580.65.06; cuda 13000"}
    assert env.describe_device(_Bare(), None) == {"device": {}, "device_driver": None}
    json.dumps(facts)


def test_no_nvidia_smi_means_no_driver_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert env.nvidia_driver() is None
    assert "device_driver" not in env.device_info("cpu")            # a CPU has no driver line
