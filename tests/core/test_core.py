"""The dependency-free core: the one atomic writer, and the import rules it makes possible."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from narbench_core import io
from narbench_core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def umask():
    """Set a umask for one test and restore the old one."""
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)
    yield set_
    os.umask(old)


def test_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    io.write_text(path, "old\n")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        io.write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["f.txt"]  # no temp file left behind


def test_failing_stream_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError):
        with io.atomic_open(tmp_path / "part.tsv") as f:
            f.write("half a line")
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_a_new_folder_is_whole_or_absent(tmp_path):
    def half(folder):
        (folder / "a.txt").write_text("a")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        io.new_folder(tmp_path / "x", half)
    assert os.listdir(tmp_path) == []
    io.new_folder(tmp_path / "x", lambda folder: (folder / "a.txt").write_text("a"))
    assert os.listdir(tmp_path) == ["x"] and (tmp_path / "x" / "a.txt").read_text() == "a"


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_files_honour_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    io.write_text(tmp_path / "a.txt", "x")
    io.write_bytes(tmp_path / "b.bin", b"x")
    with io.atomic_path(tmp_path / "c.npz", suffix=".tmp.npz") as tmp:
        np.savez(tmp, x=np.arange(3))
    for name in ("a.txt", "b.bin", "c.npz"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name
    assert np.load(tmp_path / "c.npz")["x"].tolist() == [0, 1, 2]


def test_json_and_jsonl_round_trip_numpy_and_paths(tmp_path):
    rec = {"a": np.float32(1.5), "b": np.arange(2), "c": (1, 2), "d": Path("x/y"), "e": np.int64(3)}
    io.write_jsonl(tmp_path / "r.jsonl", [rec, {"z": "ü"}])
    assert io.read_jsonl(tmp_path / "r.jsonl") == [{"a": 1.5, "b": [0, 1], "c": [1, 2], "d": "x/y", "e": 3},
                                                  {"z": "ü"}]
    io.write_json(tmp_path / "r.json", rec)
    assert json.loads((tmp_path / "r.json").read_text())["b"] == [0, 1]
    io.write_lines(tmp_path / "l.txt", iter(["a", "b"]))
    assert (tmp_path / "l.txt").read_text() == "a\nb\n"
    assert io.read_jsonl(tmp_path / "absent.jsonl") == []
    with pytest.raises(TypeError):
        io.write_json(tmp_path / "bad.json", {"x": object()})


def test_corrupt_jsonl_is_a_user_error(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(UserError, match="rows.jsonl:2: not valid JSON"):
        io.read_jsonl(tmp_path / "rows.jsonl")


def test_core_imports_only_the_standard_library():
    code = ("import sys, narbench_core, narbench_core.io, narbench_core.errors, narbench_core.tokens, "
            "narbench_core.defaults, narbench_core.paths, narbench_core.outputs, narbench_core.digest, "
            "narbench_core.runs, narbench_core.quiet; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'bench', 'models', 'suites', 'theory', "
            "'numpy', 'jax'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def _imported_packages(folder: str) -> set[str]:
    """Top-level packages of this repo that any module under ``folder`` imports (even lazily)."""
    ours = {"narbench_core", "bench", "models", "suites", "theory"}
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found & ours


def test_models_and_suites_share_only_the_core_and_never_import_bench():
    models, suites = _imported_packages("models"), _imported_packages("suites")
    assert "bench" not in models and "bench" not in suites
    assert "theory" not in models and "theory" not in suites
    assert "models" not in suites, "suites/ describes data and grids and trains nothing"
    assert (models - {"models"}) & (suites - {"suites"}) == {"narbench_core"}


_COMPILE = ("import jax, jax.numpy as jnp; from narbench_core.paths import enable_compilation_cache; "
            "print(enable_compilation_cache()); jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()")


def _compile_in(env: dict) -> Path:
    """Compile one small program in a fresh process with ``env``; the cache folder it used."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("NARBENCH_", "JAX_"))}, **env}
    out = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip().splitlines()[-1])


def test_the_compilation_cache_is_shared_through_links_and_by_narbench_jax_cache(tmp_path):
    """JAX's cache keys include the cache folder's path (jaxlib 0.10.2): a data root reached through a link, and
    data roots given one folder by NARBENCH_JAX_CACHE, load what the first process compiled (no new entries)."""
    first = _compile_in({"NARBENCH_DATA": str(tmp_path / "a")})
    assert first == (tmp_path / "a" / "jax_cache").resolve()
    entries = sorted(p.name for p in first.iterdir())
    assert entries
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert _compile_in({"NARBENCH_DATA": str(tmp_path / "link")}) == first
    assert _compile_in({"NARBENCH_DATA": str(tmp_path / "b"), "NARBENCH_JAX_CACHE": str(first)}) == first
    assert sorted(p.name for p in first.iterdir()) == entries          # both were cache hits
    assert not (tmp_path / "b" / "jax_cache").exists() or not any((tmp_path / "b" / "jax_cache").iterdir())
    off = _compile_in({"NARBENCH_DATA": str(tmp_path / "c"), "NARBENCH_JAX_CACHE": "0"})
    assert not any(off.iterdir())                                      # 0: no cache at all


_COMPILE_AFTER = ("import sys; from narbench_core.paths import enable_compilation_cache; "
                  "print(enable_compilation_cache()); assert 'jax' not in sys.modules; import jax, jax.numpy as jnp; "
                  "jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()")


def test_the_compilation_cache_is_turned_on_before_jax_is_imported_without_importing_it(tmp_path):
    """A process that turns the cache on first (a Ray job) imports JAX only when it compiles; its compiles still go to
    the cache. NARBENCH_JAX_CACHE=0 also drops a cache folder a parent process handed down."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARBENCH_", "JAX_"))}
    run = lambda more: subprocess.run([sys.executable, "-c", _COMPILE_AFTER], env={**env, **more}, capture_output=True,
                                      text=True, cwd=ROOT)
    out = run({"NARBENCH_DATA": str(tmp_path / "a")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert any((tmp_path / "a" / "jax_cache").iterdir())
    off = run({"NARBENCH_DATA": str(tmp_path / "b"), "NARBENCH_JAX_CACHE": "0",
               "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "inherited")})
    assert off.returncode == 0, off.stderr[-2000:]
    assert not (tmp_path / "inherited").exists() or not any((tmp_path / "inherited").iterdir())
