"""Failures the user's files or disk cause are one line with the fix and exit code 2, never a traceback:
a damaged checkpoint (truncated params, truncated ``narbench.json``), non-UTF-8 input to ``translate``,
an ``--out`` that is a file, a read-only results folder, a folder where a file is expected; and
``--refuse-damaged`` reaches the trainer. The checkpoint and ``translate`` ones run the real command
in a subprocess and check its whole stderr; the others run it in-process on fake models."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.cli import main
from test_cli_run import env, run_cli  # noqa: F401  (env: the fake-model CLI fixture)

ROOT = Path(__file__).resolve().parents[2]


def narbench(*args: str, stdin: bytes = b"") -> tuple[int, str, list[str]]:
    """Run ``narbench ARGS`` in a fresh process, as the ``narbench`` program does (``main()`` reads its
    arguments, and quiets the libraries): (exit code, stdout, stderr lines)."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from bench.cli import main; sys.exit(main())",
                           *map(str, args)], input=stdin, capture_output=True, cwd=ROOT, timeout=300)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode("utf-8", "replace").strip().splitlines()


def one_line(code: int, err: list[str], *parts: str) -> str:
    """The one error line of a failed command (asserting exit code 2 and every part in it)."""
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("narbench: error: ")
    for part in parts:
        assert part in err[0], (part, err[0])
    return err[0]


# -- damaged checkpoints ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_checkpoint(tmp_path_factory) -> Path:
    """A tiny AR checkpoint with one saved step and a complete record (random weights)."""
    import jax
    import optax

    from models import checkpoint, t5
    from models.config import preset

    config = preset("tiny", kind="ar", vocab_size=32)
    params = t5.init_params(config, jax.random.key(0))
    path = tmp_path_factory.mktemp("ckpt") / "ar"
    checkpoint.save(path, 2, params, optax.adafactor(1e-3).init(params))
    checkpoint.write_meta(path, {"task": "toy", "kind": "ar", "model_config": config.to_dict(),
                                 "train_config": {"steps": 2}, "complete": True, "steps_done": 2})
    return path


def truncate(path: Path) -> None:
    """Keep the first half of a file (what a full disk or an interrupted copy leaves)."""
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def largest_params_file(ckpt: Path) -> Path:
    return max((p for p in (ckpt / "state").glob("*/params/**/*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_truncated_checkpoint_params_are_named_damaged(finished_checkpoint, tmp_path):
    ckpt = Path(shutil.copytree(finished_checkpoint, tmp_path / "ar"))
    truncate(largest_params_file(ckpt))
    code, out, err = narbench("translate", "--checkpoint", ckpt, "--decoder", "greedy", stdin=b"a b\n")
    one_line(code, err, f"checkpoint {ckpt} is damaged: the parameters of step 2 cannot be read",
             "re-run the `narbench train` or `narbench run` that wrote it to retrain it")
    assert out == ""


def test_truncated_checkpoint_record_is_named_damaged(finished_checkpoint, tmp_path):
    ckpt = Path(shutil.copytree(finished_checkpoint, tmp_path / "ar"))
    truncate(ckpt / "narbench.json")
    code, _, err = narbench("translate", "--checkpoint", ckpt, "--decoder", "greedy", stdin=b"a b\n")
    one_line(code, err, f"checkpoint {ckpt} is damaged: narbench.json is not valid JSON")
    code, _, err = narbench("export", "ct2", "--checkpoint", ckpt, "--out", tmp_path / "ct2")
    one_line(code, err, "narbench.json is not valid JSON")


# -- input files -----------------------------------------------------------------------------------
def test_translate_refuses_non_utf8_input_in_one_line(tmp_path):
    """Checked before any checkpoint is read: from a file and from stdin, naming the line."""
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ok line\nb\u00e9ta\n".encode("latin-1"))
    code, _, err = narbench("translate", "--checkpoint", tmp_path / "none", "--decoder", "greedy",
                            "--source-file", latin1)
    one_line(code, err, f"{latin1}: line 2 is not UTF-8 text", "iconv")
    code, _, err = narbench("translate", "--checkpoint", tmp_path / "none", "--decoder", "greedy",
                            stdin=latin1.read_bytes())
    one_line(code, err, "stdin: line 2 is not UTF-8 text", "iconv")
    code, _, err = narbench("translate", "--checkpoint", tmp_path / "none", "--decoder", "greedy",
                            "--source-file", tmp_path)
    one_line(code, err, f"source file {tmp_path} is a folder")


def test_out_that_is_a_file_is_one_line(env, capsys, tmp_path):
    spec, _, _ = env
    taken = tmp_path / "results"
    taken.write_text("my notes\n")
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(taken), "--no-progress"], capsys)
    one_line(code, err.strip().splitlines(), f"{taken} is a file, not a folder")
    assert taken.read_text() == "my notes\n"


def read_only(folder: Path, monkeypatch) -> None:
    """Make ``folder`` read-only. Its mode does not stop root, so for root creating a file in it fails
    the way the kernel fails it for anyone else (``narbench_core.io`` creates every file by ``mkstemp``)."""
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real = tempfile.mkstemp

        def mkstemp(suffix=None, prefix=None, dir=None, text=False):
            if dir is not None and Path(dir) == folder:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                                      os.path.join(dir, f"{prefix or ''}x1y2z3{suffix or ''}"))
            return real(suffix, prefix, dir, text)
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_read_only_results_folder_is_one_line(env, capsys, monkeypatch):
    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    run_dir = next(p for p in (out / "clitest").iterdir() if p.is_dir())
    read_only(run_dir, monkeypatch)
    try:
        code, _, err = run_cli(["report", str(run_dir)], capsys)
    finally:
        run_dir.chmod(0o755)
    one_line(code, err.strip().splitlines(), f"cannot write in {run_dir}: Permission denied",
             "make it writable")


def test_eval_source_that_is_a_folder_is_one_line(env, capsys, tmp_path):
    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    ref = tmp_path / "mine.ref"
    ref.write_text("ALPHA\n")
    code, _, err = run_cli(["eval", "--run", str(out / "clitest"), "--source-file", str(tmp_path),
                            "--reference-file", str(ref)], capsys)
    one_line(code, err.strip().splitlines(), f"{tmp_path} is a folder, not a file")


def test_spec_path_that_is_a_folder_says_so(tmp_path, capsys):
    code, _, err = run_cli(["run", "--suite", str(tmp_path), "--out", str(tmp_path / "r")], capsys)
    one_line(code, err.strip().splitlines(), f"suite file {tmp_path} is a folder, not a file")
    assert "does not exist" not in err
    spec = tmp_path / "mine.toml"
    (tmp_path / "train").mkdir()
    spec.write_text('name = "mine"\n[[tasks]]\nname = "mine_de_en"\nsource_lang = "de"\ntarget_lang = "en"\n'
                    'files = { train = "train", dev = "train", test = "train" }\ntest = ["test"]\n')
    code, _, err = run_cli(["data", "check", "--spec", str(spec)], capsys)
    one_line(code, err.strip().splitlines(), f"{tmp_path / 'train'} is a folder")


def test_os_errors_of_the_users_files_are_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys, tmp_path):
    from bench.cli import os_error_line

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "rows.jsonl"))
    assert os_error_line(full).startswith(f"no space left for {tmp_path / 'rows.jsonl'}")
    assert "is a folder" in os_error_line(IsADirectoryError(errno.EISDIR, "Is a directory", str(tmp_path)))
    assert os_error_line(FileNotFoundError(errno.ENOENT, "No such file", str(tmp_path / "x"))) is None
    assert os_error_line(OSError(errno.EBADF, "Bad file descriptor")) is None

    import bench.cli.run as run_module

    def failing(err):
        def command(args):
            raise err
        return command

    monkeypatch.setattr(run_module, "cmd_report", failing(full))            # the disk fills up
    code, _, stderr = run_cli(["report", str(tmp_path)], capsys)
    one_line(code, stderr.strip().splitlines(), "no space left", "re-run the same command")
    monkeypatch.setattr(run_module, "cmd_report", failing(OSError(errno.EBADF, "Bad file descriptor")))
    with pytest.raises(OSError, match="Bad file descriptor"):                # a bug: not turned into a line
        main(["report", str(tmp_path)])


# -- --refuse-damaged reaches the trainer ---------------------------------------------------------
def test_refuse_damaged_reaches_the_suite_trainer(env, capsys, monkeypatch):
    from bench import runner

    spec, out, _ = env
    seen = []
    fake = runner.real_deps                          # the env fixture's fake deps

    def real_deps(**kwargs):
        seen.append(kwargs)
        return fake(**kwargs)
    monkeypatch.setattr("bench.runner.real_deps", real_deps)
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress", "--refuse-damaged"]) == 0
    assert main(["latency", "--suite", str(spec), "--no-progress"]) == 0
    assert seen == [{"retrain_damaged": False, "wait_for_lease": False}, {"retrain_damaged": True}]


def test_a_reader_that_leaves_early_is_not_an_error(monkeypatch, capsys):
    """`narbench results --columns | head -1`: the pipe closes under narbench's output; it stops quietly."""
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["results", "--columns"]) == 0
    assert capsys.readouterr().err == ""


# -- hardening, part 2 (issue 53, item 4): each failed with a traceback or a wrong line on e9e801b ----------------
def test_a_file_where_a_folder_is_expected_is_one_line(capsys, tmp_path):
    """EEXIST (mkdir over a file) had no branch: `train --out FILE`, `data export --out FILE`, NARBENCH_DATA=FILE."""
    from bench.cli import os_error_line

    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    err = FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(taken))
    assert os_error_line(err) == f"{taken} is a file, not a folder; move it or choose another path"
    assert os_error_line(FileExistsError(errno.EEXIST, "File exists", str(tmp_path))) is None   # a folder: a bug
    code, _, stderr = run_cli(["data", "export", "synthetic_d0", "--limit", "2", "--out", str(taken)], capsys)
    one_line(code, stderr.strip().splitlines(), f"{taken} is a file, not a folder")
    assert taken.read_text() == "mine\n"


def test_a_full_disk_without_a_file_name_is_one_line(monkeypatch, capsys, tmp_path):
    from bench.cli import os_error_line

    nameless = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))      # a write into an open file names none
    assert os_error_line(nameless).startswith("no space left on the device (No space left on device)")
    import bench.cli.run as run_module

    def full(args):
        raise nameless
    monkeypatch.setattr(run_module, "cmd_report", full)
    code, _, stderr = run_cli(["report", str(tmp_path)], capsys)
    one_line(code, stderr.strip().splitlines(), "no space left on the device", "re-run the same command")


def test_data_check_keeps_its_nonzero_exit_when_its_reader_leaves_early(monkeypatch, capsys, tmp_path):
    """`narbench data check FILES | head -1`: the defects were found, so the exit says so even if the pipe closed."""
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    tsv = tmp_path / "bad.tsv"
    tsv.write_text("ein Haus\ta house\nkaputt\n\tno source\n")
    clean = tmp_path / "good.tsv"
    clean.write_text("ein Haus\ta house\nzwei\ttwo\n")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["data", "check", str(tsv), "--source-lang", "de", "--target-lang", "en"]) == 1
    assert main(["data", "check", str(clean), "--source-lang", "de", "--target-lang", "en"]) == 0
    assert capsys.readouterr().err == ""


DAMAGED = {"run.json": b'{"status": "fini', "cells.json": b"\x00\x01", "env.json": b"[1, 2]",
           "spec.toml": b"name = \n[[["}


def test_a_damaged_run_file_is_one_line_in_status_and_report_and_never_blocks_a_new_run(env, capsys):
    """A damaged run.json, cells.json, env.json or spec.toml in an old run folder made every new `narbench run` of
    its suite fail with a traceback (issue 53); `status` and `report` on it too."""
    import shutil

    from bench import store as st

    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    finished = st.resolve_run_dir(out / "clitest")
    damaged = {}
    for i, (name, damage) in enumerate(DAMAGED.items()):
        old = finished.with_name(f"2000010{i + 1}T000000Z-{finished.name.split('-')[-1]}")   # the spec's hash
        shutil.copytree(finished, old)
        if name != "run.json":              # an unfinished run is the one a new run would resume
            st.RunStore(old).update_info(status="running")
        (old / name).write_bytes(damage)
        damaged[name] = old
        code, _, err = run_cli(["status", str(old)], capsys)             # status checks every file of the run
        one_line(code, err.strip().splitlines(), str(old / name), "damaged")
        code, _, err = run_cli(["report", str(old)], capsys)             # report: one line, if it reads the file
        assert code == 0 or one_line(code, err.strip().splitlines(), str(old / name), "damaged")
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    for name, old in damaged.items():
        assert f"skipping a damaged run folder: {old / name} is damaged" in err
        assert (old / name).read_bytes() == DAMAGED[name]                  # left as it was
    new = st.resolve_run_dir(out / "clitest")
    assert new not in (finished, *damaged.values()) and (new / "leaderboard.md").is_file()


def test_a_latest_pointer_outside_its_suite_folder_is_one_line(env, capsys):
    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    for pointer in ("../../elsewhere", "/etc", "..", ""):
        (out / "clitest" / "latest").write_text(pointer + "\n")
        code, _, err = run_cli(["report", str(out / "clitest")], capsys)
        one_line(code, err.strip().splitlines(), "latest points at", "not a run folder of its suite")


def test_no_command_writes_through_a_link_out_of_the_results_tree(env, capsys, tmp_path):
    """A run folder that is a link to somewhere else: report and eval refuse it in one line, run never resumes it,
    and the ``latest`` pointer, when it is a link, is replaced, not written through."""
    from bench import store as st

    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    finished = st.resolve_run_dir(out / "clitest")
    outside = tmp_path / "outside"
    shutil.copytree(finished, outside)
    st.RunStore(outside).update_info(status="running")            # a run a new `run` would resume
    before = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}
    link = finished.with_name(f"20990101T000000Z-{finished.name.split('-')[-1]}")   # the newest of the spec
    link.symlink_to(outside, target_is_directory=True)
    for command in (["report", str(link)], ["eval", "--run", str(link), "--source-file", str(spec),
                                              "--reference-file", str(spec)]):
        code, _, err = run_cli(command, capsys)
        one_line(code, err.strip().splitlines(), f"{link} is a link", "never through a link")
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and f"skipping run folder {link}: it is a link" in err
    assert {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()} == before      # untouched
    link.unlink()

    target = tmp_path / "elsewhere.txt"
    target.write_text("not narbench's\n")
    latest = out / "clitest" / "latest"
    latest.unlink()
    latest.symlink_to(target)
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress", "--force"], capsys)
    assert code == 0, err
    assert target.read_text() == "not narbench's\n" and not latest.is_symlink()


def test_rerunning_a_finished_run_says_it_starts_a_new_one_and_names_the_finished(env, capsys):
    from bench import store as st

    spec, out, _ = env
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "has finished" not in err
    first = st.resolve_run_dir(out / "clitest")
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0
    assert f"run {first.name} of this spec has finished (its results: {first / 'leaderboard.md'})" in err
    assert "times every cell again" in err and st.resolve_run_dir(out / "clitest") != first
