"""`narbench data prepare|stats` and `narbench tasks`: output, help and exit codes."""
from __future__ import annotations

import pytest

from bench.cli import main


def test_unknown_task_exits_2(capsys):
    assert main(["data", "stats", "no_such_task"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("narbench: error: unknown task 'no_such_task'") and "\n" not in err
    assert "bible_de_en" in err


def test_unknown_pair_exits_2(capsys):
    assert main(["data", "prepare", "--pairs", "de,fr", "--no-vocab"]) == 2
    assert "unknown pair(s) fr" in capsys.readouterr().err


def test_prepare_prints_counts(bible_prepared, capsys):
    assert main(["data", "prepare", "--pairs", "de", "--no-vocab", "--no-progress"]) == 0
    out = capsys.readouterr().out
    n = bible_prepared["de"]
    assert ["de-en", str(n["train"]), str(n["dev"]), str(n["test"])] in [l.split() for l in out.splitlines()]


def test_tasks_lists_sizes_lengths_and_missing_tfds(bible_de_vocab, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    assert main(["tasks"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert "TFDS data not found" in lines["wmt14_de_en"] and "TFDS data not found" in lines["wmt17_en_zh"]
    cols = lines["synthetic_d50"].split()
    assert cols[3:6] == ["50000", "500", "500"] and 4 <= float(cols[6]) <= 12
    cols = lines["bible_de_en"].split()
    assert 28_900 <= int(cols[3]) <= 28_975
    assert 15 < float(cols[6]) < 35 and 20 < float(cols[8]) < 50        # words, tokens (8k vocab)


def test_stats_of_one_task(capsys):
    assert main(["data", "stats", "synthetic_d0", "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert "task synthetic_d0" in out and "target_tokens" in out and "train" not in out.split("measure")[1]


@pytest.mark.parametrize("argv", [["data", "--help"], ["data", "prepare", "--help"],
                                  ["data", "stats", "--help"], ["tasks", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 0
    assert "usage: narbench" in capsys.readouterr().out
