"""Run folders of the theory suites: layout, schema, latest pointer, no overwrite; the CLI path."""
from __future__ import annotations

import json

from bench.cli import main
from bench.measure.env import capture
from theory import writer


def test_write_run_layout_and_latest(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    rows = [{"k": 1, "value": 0.5}, {"k": 2, "value": 0.25}]
    cfg = {"a": 1}
    first = writer.write_run(tmp_path, "demo", cfg, rows, "| t |\n", {"plot.png": fig}, capture(seeds={"seed": 7}))
    second = writer.write_run(tmp_path, "demo", cfg, rows, "| t |\n", {"plot.png": fig}, capture(seeds={"seed": 7}))
    assert first != second and first.exists()                    # a finished run is never overwritten
    assert writer.latest_run(tmp_path, "demo") == second
    for name in ("config.json", "env.json", "rows.jsonl", "table.md", "plot.png"):
        assert (second / name).is_file(), name
    lines = [json.loads(x) for x in (second / "rows.jsonl").read_text().splitlines()]
    assert [r["k"] for r in lines] == [1, 2]
    for r in lines:
        assert r["schema_version"] == writer.SCHEMA_VERSION and r["experiment"] == "theory/demo"
        assert r["run_id"] == second.name and r["env"]["seeds"] == {"seed": 7}
        assert {"python", "versions", "cpu_model", "date_utc", "git"} <= set(r["env"])
        assert r["env"]["versions"]["jax"] and "dirty" in r["env"]["git"]
    assert "![plot.png](plot.png)" in (second / "table.md").read_text()
    assert not [p for p in (tmp_path / "theory" / "demo").iterdir() if p.name.endswith(".tmp")]


def test_cli_samplers_writes_a_page(tmp_path, capsys):
    code = main(["theory", "samplers", "--n", "6", "--clique", "3", "--field", "2", "--couplings", "0,5",
                 "--ks", "1,3,6", "--seeds", "3", "--budget", "100", "--results-dir", str(tmp_path)])
    assert code == 0
    run = writer.latest_run(tmp_path, "samplers")
    assert (run / "samplers.png").stat().st_size > 1000
    rows = [json.loads(x) for x in (run / "rows.jsonl").read_text().splitlines()]
    assert {r["sampler"] for r in rows} == {"1-gibbs", "3-gibbs", "6-gibbs", "parallel"}
    assert "wrote" in capsys.readouterr().out


def test_cli_bad_input_exits_2(tmp_path, capsys):
    code = main(["theory", "samplers", "--n", "6", "--clique", "9", "--results-dir", str(tmp_path)])
    assert code == 2
    assert "--clique" in capsys.readouterr().err


def test_cli_attention_needs_a_padir_run(tmp_path, capsys):
    from bench.rows import SCHEMA_VERSION, Row, columns

    row = Row({**{c.name: None for c in columns()}, "schema_version": SCHEMA_VERSION, "family": "ar",
               "paradigm": "ar", "system": "ar-greedy", "test_set": "test", "checkpoint": "x", "decoder": "greedy"})
    (tmp_path / "rows.jsonl").write_text(json.dumps(dict(row)) + "\n")
    code = main(["theory", "attention", "--run", str(tmp_path), "--results-dir", str(tmp_path / "out")])
    assert code == 2
    assert "PaDIR" in capsys.readouterr().err
