"""Your own parallel text as a task: reading the files, and checking them for the defects that would
make a benchmark on them lie.

A split is either one TSV file, ``source<TAB>target[<TAB>extra reference ...]`` per line, or aligned
one-sentence-per-line files ``[source, target, extra reference ...]``. Lines end at ``\\n`` only
(``narbench_core.io.split_lines``: a Windows ``\\r\\n`` ending is accepted; a lone ``\\r``, U+2028 and
the like are characters of the text), each read as bytes and decoded as UTF-8 (a leading byte-order
mark is accepted). A TSV field holds no tab; text is stripped of surrounding whitespace.

``check_split`` / ``check_task`` report every defect with its file and line:

- ``encoding``: a line that is not UTF-8;
- ``nul``: a line holding a NUL character (``\\x00``: binary data, or UTF-16 read as UTF-8);
- ``misaligned``: a TSV line without the first line's number of columns, or aligned files of
  different lengths;
- ``empty``: an empty source, target or reference, an empty line, or a split with no line at all;
- ``header``: a first line that names columns rather than holding a sentence pair (``looks_like_header``);
- ``too_long``: more than ``max_words`` words (characters for Chinese and Japanese), or, checked
  with a tokenizer, more SentencePiece tokens (EOS included) than training keeps;
- ``duplicate``: a dev or test source that is also a training source.

``load_split`` gives a split's text and refuses one with any defect, naming the first.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from narbench_core.digest import update_with_file
from narbench_core import langs
from narbench_core.errors import UserError
from narbench_core.io import split_lines

SPLITS = ("train", "dev", "test")
DEFECT_KINDS = ("encoding", "nul", "misaligned", "empty", "header", "too_long", "duplicate")
# A sentence of more than this many words is ~130 or more SentencePiece tokens at an 8k vocabulary:
# past the 128 tokens training keeps. `narbench run` also checks the real token counts.
MAX_WORDS = 100
# Column names a header line uses: one of these words, optionally followed by digits or by a separator
# and a short suffix (src, ref2, reference_1, source-text), any case.
HEADER_WORD = re.compile(r"(source|target|src|tgt|trg|references?|refs?|translations?|hypothes[ie]s|hyp|"
                         r"input|output|text|sentences?|original|id)(\d+|[ _-][a-z0-9]{1,8})?", re.IGNORECASE)
# ISO 639-1 codes: with the languages unknown, a first line of two or more distinct codes ("de<TAB>en")
# is a header.
ISO_639_1 = frozenset("""
aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy da de dv dz ee el
en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia id ie ig ii ik io is it iu
ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na
nb nd ne ng nl nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so
sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu
""".split())


@dataclass(frozen=True)
class SplitFiles:
    """One split's files: a TSV, or aligned files (source, target, extra references)."""

    paths: tuple[str, ...]

    def __post_init__(self):
        if not self.paths:
            raise UserError("a split needs a TSV file or aligned [source, target] files")

    @property
    def is_tsv(self) -> bool:
        return len(self.paths) == 1

    def label(self) -> str:
        return self.paths[0] if self.is_tsv else " + ".join(self.paths)


@dataclass(frozen=True)
class FileTask:
    """A suite's own task: its name, languages, the files of each split and its vocabulary size."""

    name: str
    source_lang: str
    target_lang: str
    splits: tuple[tuple[str, SplitFiles], ...]     # (split, files) for train, dev and test
    vocab_size: int = 8000

    def files(self, split: str) -> SplitFiles:
        return dict(self.splits)[split]

    def digest(self) -> str:
        """A short hash of the settings and of every file's bytes (the vocabulary and data identity;
        recomputed only when a file's size or modification time changes)."""
        stats = tuple((p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for _, f in self.splits for p in f.paths)
        return _digest(self, stats)


@functools.lru_cache(maxsize=64)
def _digest(task: FileTask, stats: tuple) -> str:
    h = hashlib.sha256(repr((task.name, task.source_lang, task.target_lang, task.vocab_size)).encode())
    for split, files in task.splits:
        h.update(split.encode())
        for path in files.paths:
            update_with_file(h, path)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Defect:
    kind: str        # one of DEFECT_KINDS
    path: str
    line: int        # 1-based
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


@dataclass
class Pair:
    """One line of a split: its number, the source and the references (the target first)."""

    line: int
    source: str
    references: list[str]


@dataclass
class SplitReport:
    """What ``check_split`` found: the pairs read cleanly, the defects and length statistics."""

    files: SplitFiles
    lines: int = 0
    pairs: list[Pair] = field(default_factory=list)
    defects: list[Defect] = field(default_factory=list)

    def lengths(self, side: str, lang: str) -> list[int]:
        """Words (characters for zh/ja) of each clean pair's ``source`` or ``target``."""
        return [langs.text_length(p.source if side == "source" else p.references[0], lang) for p in self.pairs]


# ---------------------------------------------------------------------------------------- reading
def _lines(path: str, defects: list[Defect]) -> list[Optional[str]]:
    """Every line of a file decoded as UTF-8 (None where it is not UTF-8, with a defect)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"data file {path} not found; check the path (relative paths start at the spec's folder)")
    out: list[Optional[str]] = []
    for n, line in enumerate(split_lines(p.read_bytes()), 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            defects.append(Defect("encoding", path, n, f"not UTF-8 (byte {err.start}: {line[err.start:err.start + 1]!r})"))
            out.append(None)
            continue
        if "\x00" in text:
            defects.append(Defect("nul", path, n, f"a NUL character (\\x00) at character {text.index(chr(0)) + 1}: "
                                                  "binary data or another encoding (UTF-16?); save it as UTF-8 text"))
            out.append(None)
            continue
        out.append(text.removeprefix("\ufeff") if n == 1 else text)
    return out


def looks_like_header(fields: Sequence[str], source_lang: str = "", target_lang: str = "") -> bool:
    """Whether a first line's fields (source, target, references) name columns instead of holding text:
    two or more fields, each a column name (``HEADER_WORD``: source, src, target, tgt, reference,
    ref2 ...) or the code of the source or target language when they are known; with neither known,
    also two or more distinct ISO 639-1 codes ("de<TAB>en")."""
    fields = [f.strip() for f in fields]
    if len(fields) < 2 or not all(fields):
        return False
    codes = {langs.base(x) for x in (source_lang, target_lang) if x}
    if all(HEADER_WORD.fullmatch(f) or langs.base(f) in codes for f in fields):
        return True
    return (not (source_lang or target_lang) and len(set(fields)) == len(fields)
            and all(f.lower() in ISO_639_1 for f in fields))


def _columns(files: SplitFiles, defects: list[Defect]) -> tuple[int, list[tuple[int, Optional[list[str]]]]]:
    """(lines, [(line number, columns or None)]): TSV columns, or the aligned files' lines side by side."""
    if files.is_tsv:
        path = files.paths[0]
        lines = _lines(path, defects)
        rows: list[tuple[int, Optional[list[str]]]] = []
        width = None
        for n, text in enumerate(lines, 1):
            if text is None:
                rows.append((n, None))
                continue
            if not text.strip():
                defects.append(Defect("empty", path, n, "empty line"))
                rows.append((n, None))
                continue
            cols = text.split("\t")
            if width is None and len(cols) >= 2:
                width = len(cols)
            if len(cols) < 2:
                defects.append(Defect("misaligned", path, n, "no tab: expected source<TAB>target"))
                rows.append((n, None))
            elif len(cols) != width:
                defects.append(Defect("misaligned", path, n, f"{len(cols)} columns where the first line has {width}"))
                rows.append((n, None))
            else:
                rows.append((n, cols))
        return len(lines), rows
    per_file = [_lines(path, defects) for path in files.paths]
    counts = [len(x) for x in per_file]
    shortest = min(counts)
    if len(set(counts)) > 1:
        longest = counts.index(max(counts))
        sizes = ", ".join(f"{Path(p).name} {c}" for p, c in zip(files.paths, counts))
        defects.append(Defect("misaligned", files.paths[longest], shortest + 1,
                              f"the aligned files differ in length ({sizes} lines)"))
    rows = []
    for i in range(shortest):
        cols = [x[i] for x in per_file]
        rows.append((i + 1, None if any(c is None for c in cols) else cols))
    return max(counts), rows


def check_split(files: SplitFiles, source_lang: str = "", target_lang: str = "",
                max_words: int = MAX_WORDS) -> SplitReport:
    """Read a split and report every defect (duplicates need the training split: see ``check_task``)."""
    report = SplitReport(files)
    report.lines, rows = _columns(files, report.defects)
    if report.lines == 0:
        report.defects.append(Defect("empty", files.paths[0], 1, "no lines: the split is empty"))
    if rows and rows[0][0] == 1 and rows[0][1] is not None and looks_like_header(rows[0][1], source_lang, target_lang):
        shown = " | ".join(c.strip() for c in rows[0][1])
        report.defects.append(Defect("header", files.paths[0], 1, f"looks like column names ({shown}), not a "
                                                                  "sentence pair; delete the header line"))
        rows = rows[1:]
    names = ["source", "target"] + [f"reference {k}" for k in range(2, 64)]
    for n, cols in rows:
        if cols is None:
            continue
        where = files.paths[0] if files.is_tsv else None
        bad = False
        for k, text in enumerate(cols):
            path = where or files.paths[k]
            if not text.strip():
                report.defects.append(Defect("empty", path, n, f"empty {names[k]}"))
                bad = True
                continue
            size = langs.text_length(text, source_lang if k == 0 else target_lang)
            if size > max_words:
                unit = "characters" if langs.counts_characters(source_lang if k == 0 else target_lang) else "words"
                report.defects.append(Defect("too_long", path, n,
                                             f"{names[k]} of {size} {unit} > {max_words} (--max-words)"))
                bad = True
        if not bad:
            report.pairs.append(Pair(n, cols[0].strip(), [c.strip() for c in cols[1:]]))
    report.defects.sort(key=lambda d: (d.path, d.line))
    return report


def duplicate_defects(train: SplitReport, other: SplitReport) -> list[Defect]:
    """Each source of ``other`` (dev or test) that is also a training source."""
    seen = {}
    for p in train.pairs:
        seen.setdefault(p.source, p.line)
    path = other.files.paths[0]
    return [Defect("duplicate", path, p.line, f"source also in training data ({train.files.paths[0]}:{seen[p.source]})")
            for p in other.pairs if p.source in seen]


def check_task(task: FileTask, max_words: int = MAX_WORDS) -> dict[str, SplitReport]:
    """Every split of a file task checked, with dev/test sources repeated from train as defects."""
    reports = {split: check_split(files, task.source_lang, task.target_lang, max_words)
               for split, files in task.splits}
    for split in ("dev", "test"):
        if split in reports and "train" in reports:
            reports[split].defects.extend(duplicate_defects(reports["train"], reports[split]))
    return reports


def token_defects(report: SplitReport, encode: Callable[[Sequence[str]], list], max_length: int) -> list[Defect]:
    """Pairs whose source or target, in SentencePiece tokens plus EOS, exceed ``max_length`` (training
    would truncate them)."""
    out = []
    sources = encode([p.source for p in report.pairs])
    targets = encode([p.references[0] for p in report.pairs])
    for p, s, t in zip(report.pairs, sources, targets):
        for side, ids, k in (("source", s, 0), ("target", t, 1)):
            if len(ids) + 1 > max_length:
                path = report.files.paths[0 if report.files.is_tsv else k]
                out.append(Defect("too_long", path, p.line, f"{side} of {len(ids) + 1} tokens (EOS included) > "
                                                            f"max_length {max_length}; shorten or drop the pair"))
    return out


def verdict(task: str, defects: Iterable[Defect], fix: str) -> Optional[str]:
    """One line naming the first defect and how many more there are, or None when there is none."""
    defects = list(defects)
    if not defects:
        return None
    more = f" (and {len(defects) - 1} more)" if len(defects) > 1 else ""
    return f"task {task}: bad data: {defects[0]}{more}; {fix}"


def load_split(task: FileTask, split: str) -> tuple[list[str], list[list[str]]]:
    """``(sources, references)`` of a split in sacrebleu's layout; ``UserError`` on any defect."""
    report = check_split(task.files(split), task.source_lang, task.target_lang, max_words=10 ** 9)
    line = verdict(task.name, report.defects, "run `narbench data check` on the files and fix them")
    if line:
        raise UserError(line)
    sources = [p.source for p in report.pairs]
    width = len(report.pairs[0].references) if report.pairs else 1
    return sources, [[p.references[k] for p in report.pairs] for k in range(width)]


def count_lines(files: SplitFiles) -> int:
    """Lines of the split's first file (its number of pairs when the data is clean)."""
    data = Path(files.paths[0]).read_bytes()
    return data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)
