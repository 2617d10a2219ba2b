"""The documentation says what the code and the committed runs say: the README's headline figures are the
linked run's rows, every relative link resolves, and docs/results_format.md lists the columns bench/rows.py
declares."""
from __future__ import annotations

import re
from pathlib import Path

from bench import families
from bench.cli import main
from bench.columns import Column, count, ms, yes_no
from bench.families.base import Family
from bench.report.names import display_names
from bench.rows import COLUMNS_BEGIN, COLUMNS_END, columns, columns_markdown
from bench.store import RunStore

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# ------------------------------------------------------------------------------------------ helpers

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """Markdown without its code blocks and code spans (their brackets are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m[1]) for m in re.finditer(r"^#+\s+(.*)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.M)}


def broken_links(path: Path, root: Path) -> list[str]:
    """Every relative link of a markdown file whose target (file, and heading anchor in a markdown file)
    does not exist inside ``root``."""
    out = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):                   # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.is_relative_to(root.resolve()) or not dest.exists():
            out.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return out


def documentation() -> list[Path]:
    return [README, REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md")),
            *sorted((REPO / "results").glob("*/*/NOTES.md"))]


def section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README has no '## {title}' section"
    return m[1]


def table(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """The first markdown table of ``text``: its header and its rows as header -> cell."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header, body = cells[0], cells[2:]
    return header, [dict(zip(header, row)) for row in body]


# ------------------------------------------------------------------------------------------- README

def _speedup(row) -> str:
    lo, hi = row.speedup_p50_ci
    return f"{row.speedup_p50_vs_ar:.2f}x [{lo:.2f}, {hi:.2f}]"


def _training_hours(row) -> str:
    """Hours that went into the system's models: its own training, the warm start's and the distillation's."""
    if row.train_seconds is None:
        return "–"
    return f"{(row.train_seconds + (row.warm_start_seconds or 0) + (row.distill_seconds or 0)) / 3600:.2f}"


HEADLINE = {     # a column of the README's headline table -> the row's figure as the README prints it
    "BLEU": lambda r: f"{r.bleu:.2f}",
    "p50 ms": lambda r: ms(r.latency_p50_ms),
    "speedup vs AR greedy [95% CI]": _speedup,
    "train steps": lambda r: count(r.train_steps),
    "training h": _training_hours,
    "still improving": lambda r: yes_no(r.still_improving),
}
RUN_LINK = re.compile(r"\[([^\]\n]+)\]\((results/[^)\s]+)/leaderboard\.md\)")


def headline_problems(text: str) -> list[str]:
    """What the headline section ``text`` says that its runs do not: every figure of its table is the linked
    run's row (a column "BLEU, converged" reads the run linked as "[converged](...)", and with one linked
    run a bare "BLEU" reads that one; "–" where the run has no such system), each run is its suite's
    newest, and the text names each run's commit, date, CPU and sentence count."""
    runs = {label: REPO / path for label, path in RUN_LINK.findall(text)}
    if not runs:
        return ["the headline names no run (a link to results/<suite>/<run_id>/leaderboard.md)"]
    problems = [f"the headline quotes {d.name}, not the newest committed run of its suite" for d in runs.values()
                if (d.parent / "latest").read_text().strip() != d.name]
    test_set = re.search(r"test set `([^`]+)`", text)[1]
    rows = {label: RunStore(d).rows() for label, d in runs.items()}
    shown = {label: {display_names(rs)[r.system]: r for r in rs if r.test_set == test_set}
             for label, rs in rows.items()}
    header, body = table(text)
    if header[0] != "System" or not 0 < len(body) <= 10:
        return problems + [f"the table needs a System column and 1 to 10 rows: {header}, {len(body)} rows"]
    columns = {}
    for column in header[1:]:
        metric, _, label = column.rpartition(", ")
        if label not in runs:
            metric, label = column, (next(iter(runs)) if len(runs) == 1 else None)
        if metric not in HEADLINE or label is None:
            problems.append(f"column {column!r}: say one of {sorted(HEADLINE)}, then ', <run>' with several runs")
        else:
            columns[column] = (metric, label)
    for line in body:
        system = line["System"]
        if not any(system in shown[label] for label in runs):
            where = ", ".join(d.name for d in runs.values())
            problems.append(f"no system shown as {system!r} on {test_set} in {where}")
        for column, (metric, label) in columns.items():
            row = shown[label].get(system)
            want = "–" if row is None else HEADLINE[metric](row)
            if line[column] != want:
                problems.append(f"{system}, {column}: the README says {line[column]}, run {runs[label].name} {want}")
    for label, rs in rows.items():
        first, n = rs[0], {r.n_sentences for r in shown[label].values()}
        for said in (f"commit {first.git_commit[:7]}", first.date_utc[:10], first.cpu_model,
                     *(f"{count} sentences" for count in n)):
            if said not in text:
                problems.append(f"the headline does not say {said!r} (run {runs[label].name})")
    return problems


def test_readme_headline_figures_are_the_linked_runs_rows():
    problems = headline_problems(section(README.read_text(encoding="utf-8"), "Headline result"))
    assert not problems, "\n".join(problems)


def test_a_headline_of_two_runs_is_checked_column_by_column():
    default, grid = (sorted((REPO / "results" / suite).glob("2*"))[-1] for suite in ("default", "grid-de-en"))
    shown = {}
    for name, d in (("default", default), ("grid", grid)):
        rows = RunStore(d).rows()
        shown[name] = {display_names(rows)[r.system]: r for r in rows if r.test_set == "bible_de_en:test"}
    ar = {name: shown[name]["AR greedy"] for name in shown}
    only_grid = next(n for n in shown["grid"] if n not in shown["default"])
    other = shown["grid"][only_grid]
    said = " ".join(f"commit {r.git_commit[:7]} {r.date_utc[:10]} {r.cpu_model} {r.n_sentences} sentences"
                    for r in ar.values())
    text = (f"[90 min]({default.relative_to(REPO)}/leaderboard.md), [grid]({grid.relative_to(REPO)}/leaderboard.md); "
            f"test set `bible_de_en:test`; {said}\n\n"
            "| System | BLEU, 90 min | BLEU, grid | training h, grid |\n|---|---:|---:|---:|\n"
            f"| AR greedy | {ar['default'].bleu:.2f} | {ar['grid'].bleu:.2f} | {_training_hours(ar['grid'])} |\n"
            f"| {only_grid} | – | {other.bleu:.2f} | {_training_hours(other)} |\n")
    assert headline_problems(text) == []
    wrong = text.replace(f"| {ar['default'].bleu:.2f} | {ar['grid'].bleu:.2f} |", f"| {ar['default'].bleu:.2f} | 1.00 |", 1)
    assert headline_problems(wrong) == [
        f"AR greedy, BLEU, grid: the README says 1.00, run {grid.name} {ar['grid'].bleu:.2f}"]
    bare = text.replace("| BLEU, 90 min |", "| BLEU |")
    assert [p.split(":")[0] for p in headline_problems(bare)] == ["column 'BLEU'"]
    missing = text.replace(f"| {only_grid} | – |", f"| {only_grid} | 3.00 |")
    assert headline_problems(missing) == [f"{only_grid}, BLEU, 90 min: the README says 3.00, run {default.name} –"]


def test_every_committed_suite_folder_points_latest_at_its_newest_run():
    suites = {run.parent for run in (p.parent for p in (REPO / "results").rglob("run.json"))}
    assert suites, "no committed run folders found"
    for folder in sorted(suites):
        newest = max(p.parent.name for p in folder.glob("*/run.json"))
        latest = folder / "latest"
        assert latest.is_file() and latest.read_text().strip() == newest, (
            f"{folder.relative_to(REPO)}/latest should name {newest} (`narbench report` and the pages read it)")


GPU_LINK = re.compile(r"\]\((results/gpu-speedmap/[^)\s/]+)/speedmap\.md\)")


def test_readme_gpu_figures_are_the_committed_gpu_runs_rows():
    """The README's GPU table is the linked GPU map's batch-1 rows of PaDIR T=4 k=1 and AR greedy: p50s, the
    measured speedup and the projected one on the device the run names; the text names its commit and date."""
    import json

    from bench.latency_map.spec import read_rows

    text = section(README.read_text(encoding="utf-8"), "On a GPU")
    (link,) = GPU_LINK.findall(text)
    run = REPO / link
    assert (run.parent / "latest").read_text().strip() == run.name, "the README should quote the newest GPU run"
    env = json.loads((run / "env.json").read_text())
    assert env["platform"] == "gpu" and env["git"]["commit"][:7] in text and env["date_utc"][:10] in text
    assert env["device_kind"] in text
    rows = {(r["target_length"], r["system"]): r for r in read_rows(run / "rows.jsonl")
            if r["batch_size"] == 1 and r["size"] == "paper"}
    header, body = table(text)
    assert header == ["target tokens", "AR greedy p50 ms", "PaDIR T=4 k=1 p50 ms", "speedup", "projected speedup"]
    assert body, "the GPU table has no rows"
    for line in body:
        length = int(line["target tokens"])
        ar, padir = rows[(length, "ar-greedy")], rows[(length, "padir-T4-k1")]
        col = f"projection_{padir['device_projection']}_ms"
        assert line == {"target tokens": str(length), "AR greedy p50 ms": f"{ar['latency_p50_ms']:.1f}",
                        "PaDIR T=4 k=1 p50 ms": f"{padir['latency_p50_ms']:.1f}",
                        "speedup": f"{padir['speedup_p50_vs_ar']:.2f}x",
                        "projected speedup": f"{ar[col] / padir[col]:.2f}x"}, f"README GPU row {length}"


def test_readme_pandas_snippet_runs_on_the_committed_run(monkeypatch, capsys):
    code = re.search(r"```python\n(.*?)```", section(README.read_text(encoding="utf-8"),
                                                     "Reading results with pandas"), re.S)[1]
    monkeypatch.chdir(REPO)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "ar-greedy" in printed and "speedup_p50_vs_ar" in printed


def test_readme_keeps_the_two_set_up_commands_on_top():
    lines = README.read_text(encoding="utf-8").splitlines()[:6]
    assert lines[0] == "# narbench" and lines[2] == "```bash" and lines[5] == "```"
    assert lines[3].endswith('pip install -e ".[ct2,ort]" && narbench run')
    assert lines[4].endswith('pip install -e ".[dev]" && python -m pytest -q')
    assert "python -m pytest -q" in (REPO / ".ci" / "run").read_text()          # CI runs README's test command


# -------------------------------------------------------------------------------------------- links

def test_every_relative_link_of_the_documentation_resolves():
    assert (REPO / "CHANGELOG.md").is_file()
    broken = [b for path in documentation() for b in broken_links(path, REPO)]
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some `code` heading\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#some-code-heading) [web](https://x.org/y) "
                    "`[not a link](nowhere.md)` [gone](docs/b.md) [bad](docs/a.md#nope) [out](../x.md)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page, tmp_path) == ["README.md: docs/b.md (no such file)",
                                            "README.md: docs/a.md#nope (no such heading)",
                                            "README.md: ../x.md (no such file)"]


def test_no_file_points_to_a_design_document_outside_the_repository():
    needle = "DESIGN" + ".md"                         # (spelled apart, so this file does not find itself)
    found = [str(p.relative_to(REPO)) for p in sorted(REPO.rglob("*"))
             if p.suffix in (".py", ".md", ".toml") and p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
             and needle in p.read_text(encoding="utf-8", errors="replace")]
    assert not found, f"{needle} is not in the repository; point to docs/ instead: {found}"


# ------------------------------------------------------------------------------------------ columns

def test_results_format_lists_the_columns_bench_rows_declares():
    text = (REPO / "docs" / "results_format.md").read_text(encoding="utf-8")
    assert COLUMNS_BEGIN in text and COLUMNS_END in text
    block = text[text.index(COLUMNS_BEGIN):text.index(COLUMNS_END) + len(COLUMNS_END)] + "\n"
    assert block == columns_markdown(), ("docs/results_format.md's column list differs from bench.rows: replace "
                                         "the block between its markers with `narbench results --columns`")


class _Quill(Family):
    name, label = "quill", "Quill"
    columns = (Column("nib", "nib", doc="a | b"),)


def test_the_column_reference_lists_every_column_once_and_a_family_under_its_label():
    families.register(family := _Quill())
    try:
        text, names = columns_markdown(), [c.name for c in columns()]
    finally:
        families.unregister(family.name)
    assert "nib" in names
    assert re.findall(r"^\| `(\w+)` \|", text, re.M) == names
    quill = text[text.index("### Quill systems only"):].splitlines()
    assert quill[4] == "| `nib` | nib |  | a \\| b |"                  # a pipe in a doc stays in its cell
    assert "`nib`" not in columns_markdown()                                 # gone with its family


def test_cli_prints_the_column_reference(capsys):
    assert main(["results", "--columns"]) == 0
    assert capsys.readouterr().out == columns_markdown()
    assert main(["results"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--columns" in err[0]


def test_the_documentation_gives_the_presets_their_true_sizes():
    from models.config import PRESETS

    text = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    for name, size in PRESETS.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}`"))
        assert (f"| {size['d_model']} | {size['num_heads']} x {size['head_dim']} | {size['d_ff']} | "
                f"{size['num_encoder_layers']} + {size['num_decoder_layers']} | {size['max_target_length']} |") in row
    pages = [README, *(REPO / "docs").glob("*.md"), *(REPO / "suites" / "specs").glob("*.toml")]
    wrong = [p.name for p in pages if re.search(r"FFN:? 1024", p.read_text(encoding="utf-8"))]
    assert not wrong, f"`small` has d_ff {PRESETS['small']['d_ff']}, not 1024: {wrong}"


def _tracked(under: str = "") -> list[str] | None:
    """The files git tracks (paths relative to the repository), or None outside a git checkout."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z", "--", under or "."], cwd=REPO, capture_output=True)
    return [name.decode() for name in listed.stdout.split(b"\0") if name] if listed.returncode == 0 else None


def test_every_committed_leaderboard_run_tracks_its_samples():
    """A committed run's figures are recomputed from its samples, so git holds them: the quick run's lost theirs
    when samples were compressed (dceb477: the plain file went, the .gz sat under .gitignore's results/quick/)."""
    import pytest

    from bench.store import PLAIN_SAMPLES, ROWS, SAMPLES

    listed = _tracked("results")
    if listed is None:
        pytest.skip("not a git checkout")
    tracked = set(listed)
    runs = {Path(name).parent for name in tracked if name.endswith("/leaderboard.md")}
    assert runs, "no committed leaderboard runs found"
    missing = sorted(str(run) for run in runs if str(run / ROWS) in tracked
                     and not {str(run / SAMPLES), str(run / PLAIN_SAMPLES)} & tracked)
    assert not missing, f"committed runs without their samples in git (git add -f them): {missing}"


TREE_BUDGET_MB = 60       # tracked files (49.2 MB late on 2026-11-29: under the 64 MiB a device call takes); samples are gzip


def test_the_tracked_tree_stays_under_its_budget():
    """A clone stays light: the tracked files add up to less than ``TREE_BUDGET_MB`` (254 MB before 2026-11-29, when
    six superseded default runs moved to git history and four runs' samples were compressed). Lower it as the other
    committed runs' plain samples are compressed; a GPU machine takes a tree of 64 MiB."""
    import pytest

    tracked = _tracked()
    if tracked is None:
        pytest.skip("not a git checkout")
    files = [REPO / name for name in tracked]
    total = sum(f.stat().st_size for f in files if f.is_file())
    assert total < TREE_BUDGET_MB * 1e6, f"the tracked files take {total / 1e6:.1f} MB, over {TREE_BUDGET_MB} MB"
