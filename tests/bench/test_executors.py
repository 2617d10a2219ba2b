"""The executor seam without Ray: the runner's training jobs (a DAG), the local executor, cells.json and
`narbench status`, and the refusal to resume a run's timing on another CPU."""
from __future__ import annotations

import json

import pytest

from bench import executors, store as st
from bench.cli import main
from bench.families import load_suite
from bench.plan import expand
from bench.runner import Runner
from grid_fakes import FakeFactory, fake_deps, fake_spec
from narbench_core.errors import UserError
from narbench_core.paths import portable

SPEC = fake_spec("exectest", test=["test"], ar_decoders=["greedy"], padir_iterations=[1, 2], max_test_sentences=6)


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "exectest.toml"
    path.write_text(SPEC)
    return load_suite(path)


def test_training_jobs_are_a_dag_with_one_distillation_per_teacher(spec, tmp_path):
    text = SPEC.replace("iterations = [1, 2]", "iterations = [1, 2]\nunmask_rate = [0.15, 0.3]")
    path = tmp_path / "two.toml"
    path.write_text(text)
    spec = load_suite(path)
    runner = Runner(spec, fake_deps(tmp_path / "ckpt"), progress=False)
    jobs = runner.training_jobs(list(expand(spec).train_cells))
    keys = [j.key for j in jobs]
    assert keys[0] == "train ar fake_task seed 0" and keys[1] == "distill ar fake_task seed 0"
    distilled = [j for j in jobs if j.needs == ("distill ar fake_task seed 0",)]
    assert len(distilled) == 2 and keys.count("distill ar fake_task seed 0") == 1   # two students, one distillation
    assert {j.kind for j in jobs} == {"train", "distill"} and len(jobs) == 6        # AR, 1 distillation, 4 PaDIR
    executors.check_order(jobs)                                                    # needs come first
    with pytest.raises(ValueError, match="needs"):
        executors.check_order(jobs[2:])


def test_a_match_budget_job_is_built_once_its_baseline_is_done(tmp_path):
    text = SPEC.replace("[train.padir]\nsteps = 5", "[train.padir]\nsteps = 5\nmatch = \"flops\"")
    path = tmp_path / "match.toml"
    path.write_text(text)
    spec = load_suite(path)
    jobs = Runner(spec, fake_deps(tmp_path / "ckpt"), progress=False).training_jobs(list(expand(spec).train_cells))
    raw = next(j for j in jobs if j.kind == "train" and "padir" in j.key and "distill" not in j.key)
    assert raw.after == ("train ar fake_task seed 0",) and raw.needs == ()
    student = next(j for j in jobs if "distill" in j.key and j.kind == "train")
    assert student.after == ("distill ar fake_task seed 0", "train ar fake_task seed 0")


def test_the_local_executor_runs_jobs_in_order_and_records_their_states(spec, tmp_path):
    run = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")[0]
    deps = fake_deps(tmp_path / "ckpt")
    Runner(spec, deps, run, progress=False).run()
    board = json.loads((run.path / st.CELLS).read_text())
    assert board["executor"] == "local"
    ar, student, raw = expand(spec).train_cells
    assert [(c["cell"], c["kind"], c["state"]) for c in board["cells"]] == [
        (f"train {ar.label}", "train", "done"), (f"distill {ar.label}", "distill", "done"),
        (f"train {student.label}", "train", "done"), (f"train {raw.label}", "train", "done"),
        ("time+score fake_task:test", "evaluate", "done")]
    assert all(c["host"] and c["attempt"] == 1 and c["seconds"] is not None for c in board["cells"][:4])
    assert json.loads((run.path / st.ENV).read_text())["executor"] == {"executor": "local"}
    run.release()


def test_a_failing_job_is_marked_failed_and_raises(spec, tmp_path):
    def broken(*args, **kwargs):
        raise UserError("the fake trainer is broken; fix it")

    run = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")[0]
    deps = fake_deps(tmp_path / "ckpt")
    deps.train = broken
    with pytest.raises(UserError, match="broken"):
        Runner(spec, deps, run, progress=False).run()
    cells = {c["cell"]: c for c in json.loads((run.path / st.CELLS).read_text())["cells"]}
    assert cells["train ar fake_task seed 0"]["state"] == "failed"
    assert cells["train ar fake_task seed 0"]["error"] == "the fake trainer is broken; fix it"
    assert [c["state"] for c in cells.values()] == ["failed"] + ["pending"] * 4   # nothing after it ran
    run.release()


@pytest.fixture
def cli(tmp_path, monkeypatch, fixed_peaks):
    monkeypatch.setattr("bench.runner.real_deps", lambda **_: fake_deps(tmp_path / "ckpt", FakeFactory()))
    path = tmp_path / "exectest.toml"
    path.write_text(SPEC)
    return path, tmp_path / "results"


def test_status_prints_the_jobs_and_whether_the_run_is_driven(cli, capsys, tmp_path):
    path, out = cli
    assert main(["run", "--suite", str(path), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["status", str(out / "exectest")]) == 0
    text = capsys.readouterr().out
    assert "finished" in text.splitlines()[0] and "rows: 5 " in text
    assert "jobs (local executor" in text and "5 done" in text
    assert "| train ar fake_task seed 0 | train | done |" in text
    # A run stopped half-way (its process gone): status says so and how to resume, and the job it was
    # running when it stopped is "stopped", not "running".
    run_dir = st.resolve_run_dir(out / "exectest")
    info = json.loads((run_dir / st.RUN).read_text())
    (run_dir / st.RUN).write_text(json.dumps({**info, "status": "running"}))
    board = json.loads((run_dir / st.CELLS).read_text())
    board["cells"][-1]["state"] = "running"
    (run_dir / st.CELLS).write_text(json.dumps(board))
    assert main(["status", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "stopped before it finished; re-run its command to resume: narbench run" in text
    assert "4 done, 1 stopped" in text and "| running |" not in text
    assert f"| {board['cells'][-1]['cell']} | {board['cells'][-1]['kind']} | stopped |" in text


def test_status_of_a_suite_folder_reads_its_newest_run_finished_or_not(cli, capsys):
    # A --train-only run never finishes, so its suite folder has no `latest`: status reads the newest run
    # folder; a command that reads results names that folder and status instead of "not a run folder".
    path, out = cli
    assert main(["run", "--suite", str(path), "--out", str(out), "--no-progress"]) == 0
    run_dir = st.resolve_run_dir(out / "exectest")
    info = json.loads((run_dir / st.RUN).read_text())
    (run_dir / st.RUN).write_text(json.dumps({**info, "status": "running"}))
    (out / "exectest" / st.LATEST).unlink()
    older = out / "exectest" / "20000101T000000Z-00000000"
    older.mkdir()
    (older / st.RUN).write_text(json.dumps(info))
    capsys.readouterr()
    assert main(["status", str(out / "exectest")]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{run_dir}: stopped before it finished")
    assert "| job | kind | state | host | attempt | seconds | error |\n|---|---|---|---|---:|---:|---|" in text
    assert main(["results", str(out / "exectest")]) == 2
    err = capsys.readouterr().err
    assert f"has no finished run yet (no latest file); pass one of its run folders, e.g. {run_dir}," in err
    assert f"narbench status {out / 'exectest'}" in err and len(err.strip().splitlines()) == 1


def test_status_shows_where_a_training_under_way_stands(tmp_path, monkeypatch, fixed_peaks, capsys):
    # A run whose process trains the AR model (this test's process holds its lock): status adds the plan's lines for
    # that training, its checkpoint's step and last dev point; none for the jobs that are done or pending.
    from grid_fakes import fake_locator
    from models.curves import write_curve
    from narbench_core import lock

    deps = fake_deps(tmp_path / "ckpt", FakeFactory())
    monkeypatch.setattr("bench.runner.real_deps", lambda **_: deps)
    monkeypatch.setattr("bench.preview.real_locator", lambda: fake_locator(deps))
    path, out = tmp_path / "exectest.toml", tmp_path / "results"
    path.write_text(SPEC)
    assert main(["run", "--suite", str(path), "--out", str(out), "--no-progress"]) == 0
    run_dir = st.resolve_run_dir(out / "exectest")
    info = json.loads((run_dir / st.RUN).read_text())
    (run_dir / st.RUN).write_text(json.dumps({**info, "status": "running"}))
    board = json.loads((run_dir / st.CELLS).read_text())
    [ar] = [c for c in board["cells"] if c["cell"] == "train ar fake_task seed 0"]
    ar["state"] = "running"
    (run_dir / st.CELLS).write_text(json.dumps(board))
    [folder] = [f.parent for f in (tmp_path / "ckpt").glob("*/narbench.json")
                if json.loads(f.read_text())["family"] == "ar"]
    (folder / "narbench.json").write_text(json.dumps({"steps_done": 3}))
    write_curve(folder, [{"step": 2, "dev_bleu": 10.0, "dev_nll": 3.5}, {"step": 3, "dev_bleu": 12.345}])
    capsys.readouterr()
    lock.acquire(run_dir, "narbench run --suite exectest")
    try:
        assert main(["status", str(run_dir)]) == 0
    finally:
        lock.release(run_dir)
    text = capsys.readouterr().out
    assert text.startswith(f"{run_dir}: running: narbench pid ")
    head, under_way = text.split("\nTrainings under way (as `narbench plan` sees their checkpoints on this machine):\n")
    assert "| train ar fake_task seed 0 | train | running |" in head
    lines = under_way.splitlines()
    assert lines[0] == "  partial   ar fake_task seed 0" and lines[1].strip() == portable(folder)
    assert lines[2] == "            resumes at step 3; its last dev point: step 3, dev BLEU 12.35"
    assert lines[3].startswith("            ~") and len(lines) == 4


def test_a_train_only_run_says_so_to_status_while_it_runs(cli, capsys, monkeypatch):
    # The lock says what the process does (--train-only); run.json keeps the command that resumes the run to its end.
    from bench.runner import Runner

    path, out = cli
    seen = []

    def run(self):
        assert main(["status", str(out / "exectest")]) == 0
        seen.append(capsys.readouterr().out.splitlines()[0])
        return []
    monkeypatch.setattr(Runner, "run", run)
    assert main(["run", "--suite", str(path), "--out", str(out), "--no-progress", "--train-only"]) == 0
    command = f"narbench run --suite {path} --out {out}"
    assert ": running: narbench pid " in seen[0] and f"({command} --train-only) since " in seen[0]
    assert st.RunStore(st.resolve_run_dir(out / "exectest", newest=True)).info["command"] == command


def test_status_of_a_run_from_before_cells_json(cli, capsys):
    path, out = cli
    assert main(["run", "--suite", str(path), "--out", str(out), "--no-progress"]) == 0
    run_dir = st.resolve_run_dir(out / "exectest")
    (run_dir / st.CELLS).unlink()
    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0
    assert "no cells.json: this run was started before narbench recorded its jobs" in capsys.readouterr().out


def test_address_needs_the_ray_executor(cli, capsys):
    path, out = cli
    assert main(["run", "--suite", str(path), "--out", str(out), "--address", "h:6379"]) == 2
    assert "--address joins a Ray cluster; add --executor ray" in capsys.readouterr().err
    assert not out.exists()                                        # refused before any run folder


def test_the_ray_executor_without_ray_says_how_to_install_it(monkeypatch):
    import sys

    from bench.executors import raycluster

    monkeypatch.setitem(sys.modules, "ray", None)                 # `import ray` raises ImportError
    with pytest.raises(UserError, match=r"pip install 'narbench\[ray\]'"):
        raycluster.RayExecutor().run([executors.Job("x", "train", lambda r: print)], executors.Board("ray"))


def test_timing_a_run_on_another_cpu_is_refused(cli, capsys, monkeypatch):
    path, out = cli
    code = main(["run", "--suite", str(path), "--out", str(out), "--no-progress"])
    assert code == 0
    run_dir = st.resolve_run_dir(out / "exectest")
    info = json.loads((run_dir / st.RUN).read_text())
    (run_dir / st.RUN).write_text(json.dumps({**info, "status": "running"}))   # as if stopped half-way
    env = json.loads((run_dir / st.ENV).read_text())
    (run_dir / st.ENV).write_text(json.dumps({**env, "cpu_signature": "Another CPU (family 6 model 85; avx2)"}))
    capsys.readouterr()
    assert main(["run", "--suite", str(path), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "this run was timed on Another CPU (family 6 model 85; avx2) and this machine is" in err
    assert "--force" in err and len(err.strip().splitlines()) == 2     # "resuming ..." and the one error line
    assert json.loads((run_dir / st.ENV).read_text())["cpu_signature"].startswith("Another CPU")   # untouched


def test_a_run_with_nothing_timed_yet_may_move_to_another_cpu():
    from bench.measure import env as benv

    benv.check_same_machine({"cpu_signature": "A"}, {"cpu_signature": "B"}, timed=False)
    benv.check_same_machine({"cpu_model": "A"}, {"cpu_signature": "A (family 1)", "cpu_model": "A"}, timed=True)
    with pytest.raises(UserError):
        benv.check_same_machine({"cpu_model": "A"}, {"cpu_signature": "B (x)", "cpu_model": "B"}, timed=True)
