"""Where the gap goes (bench.gap) with fake decoders: every variant of the chosen PaDIR systems, once per split,
scored against each test set of the split; the training fit of the system's model and of AR greedy; resuming;
the page's table."""
from __future__ import annotations

import pytest

from bench.gap import AS_RUN, FIT, chosen, diagnose, gap_table, keys, render_gap_page, variants
from grid_fakes import fake_row
from narbench_core.errors import UserError

SETS = ("t:test", "t:test+refs")
BLEU = {AS_RUN: 20.0, "oracle length": 24.5, "keep repeats": 19.0, "k=3": 21.0, "k=5": 21.5, "k=10": 21.75,
        "T=10": 20.5, "T=20": 20.25, FIT: 40.0}


def rows():
    out = []
    for ts in SETS:
        out.append(fake_row("ar-greedy", ts, family="ar", paradigm="ar", bleu=30.0, baseline_system="ar-greedy",
                            decoder="greedy", hypotheses=1, task="t"))
        out.append(fake_row("padir-s4", ts, family="padir", paradigm="nar", bleu=20.0, baseline_system="ar-greedy",
                            decoder="refine:4", iterations=4, hypotheses=1, task="t"))
        out.append(fake_row("padir-s10-k5", ts, family="padir", paradigm="nar", bleu=22.0,
                            baseline_system="ar-greedy", decoder="refine:10", iterations=10, hypotheses=5, task="t"))
    return out


class Fakes:
    def __init__(self):
        self.decoded, self.fitted, self.lengths_of = [], [], []

    def decode(self, row, v, sources, lengths):
        self.decoded.append((row.system, v.name, lengths))
        return [f"{v.name}|{row.system}"] * len(sources)

    def fit(self, row):
        self.fitted.append(row.system)
        return ["a", "b"], ["A", "B"]

    def lengths(self, row, references):
        self.lengths_of.append(list(references))
        return [len(r) + 1 for r in references]

    @staticmethod
    def bleu(row, hyps, refs):
        variant, system = hyps[0].split("|")
        if variant == FIT and system == "ar-greedy":
            return 55.0
        return BLEU[variant] + (0.5 if len(refs) > 1 else 0.0)           # +refs scores a little higher


def run(done=frozenset()):
    fakes, records = Fakes(), []
    splits = {"t:test": (["s1", "s2", "s3"], {"t:test": [["r1", "r2", "r3"]],
                                                "t:test+refs": [["r1", "r2", "r3"], ["q1", "q2", "q3"]]})}
    all_rows = rows()
    diagnose(all_rows, chosen(all_rows), fakes.decode, splits, fakes.fit, fakes.lengths, fakes.bleu, done,
             records.append, progress=lambda line: None)
    return fakes, records


def test_every_variant_of_each_chosen_system_once_per_split_and_the_fits():
    assert [v.name for v in variants(4, 1)] == [AS_RUN, "oracle length", "keep repeats", "k=3", "k=5", "k=10",
                                                "T=10", "T=20", FIT]
    assert {r.system for r in chosen(rows())} == {"padir-s4"}                  # T = 4, k = 1 by default
    fakes, records = run()
    test_decodes = [d for d in fakes.decoded if d[1] != FIT]
    assert [d[1] for d in test_decodes] == [v.name for v in variants(4, 1)][:-1]   # once per split, not per set
    assert [d[2] for d in test_decodes if d[1] == "oracle length"] == [[3, 3, 3]]  # first reference stream's
    assert all(d[2] is None for d in test_decodes if d[1] != "oracle length")
    assert fakes.lengths_of == [["r1", "r2", "r3"]] and fakes.fitted == ["padir-s4", "ar-greedy"]
    assert len(records) == 8 * 2 + 2 and all(r["diagnostic"] for r in records)
    by = {(r["system"], r["test_set"], r["variant"]): r["bleu"] for r in records}
    assert by[("padir-s4", "t:test", "oracle length")] == 24.5 and by[("padir-s4", "t:test+refs", "k=3")] == 21.5
    assert by[("padir-s4", "train", FIT)] == 40.0 and by[("ar-greedy", "train", FIT)] == 55.0
    again, more = run(done=keys(records))                                        # resumed: nothing left to do
    assert again.decoded == [] and more == []
    cut = [r for r in records if not (r["system"] == "ar-greedy" and r["variant"] == FIT)]
    resumed, rest = run(done=keys(cut))                  # killed between the two fits: only AR greedy's is left
    assert resumed.fitted == ["ar-greedy"] and [(r["system"], r["variant"]) for r in rest] == [("ar-greedy", FIT)]


def test_the_table_shows_the_gap_and_what_each_change_adds():
    _, records = run()
    body = gap_table(rows(), records, "t:test")
    header, line = body[0], body[2]
    assert "oracle length: +BLEU" in header and "train BLEU, AR greedy" in header
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == ["padir-s4", "–", "20.00", "-10.00", "20.00"]
    assert "+4.50" in cells and "-1.00" in cells and cells[-2:] == ["40.00", "55.00"]
    page = render_gap_page(rows(), records, {"suite": "s", "run_id": "r"})
    assert "## t:test" in page and "## t:test+refs" in page and "## train" not in page


def test_an_unknown_system_is_one_line():
    with pytest.raises(UserError, match="'nope' is not a scored PaDIR system of this run") as err:
        chosen(rows(), ["nope"])
    assert "\n" not in str(err.value)
    assert {r.system for r in chosen(rows(), ["padir-s10-k5"])} == {"padir-s10-k5"}
