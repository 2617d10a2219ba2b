r"""The one atomic writer: a reader sees the old file or the whole new one, never a part.

Every write goes to a hidden temp file in the target's folder, is flushed and fsynced, gets the
permissions a plain ``open(path, "w")`` would give (``0o666`` less the umask: ``mkstemp`` alone gives
``0o600``, which teammates on a shared cluster cannot read), and is then ``os.replace``d into place.
A failure removes the temp file and leaves the target untouched.

- ``atomic_open(path, mode)``: a file object to stream into (``"w"`` text or ``"wb"`` bytes);
- ``atomic_path(path)``: a temp path for a library that writes by file name (``np.savez``);
- ``temp_dir(parent, prefix)``: a folder to fill and rename into place (umask permissions, unlike ``mkdtemp``);
- ``new_folder(path, fill)``: a new folder whole or not at all, filled in such a temp folder;
- ``write_text``, ``write_lines``, ``write_bytes``, ``write_json``, ``write_jsonl``: whole files in one call;
- ``read_jsonl``: the records of a JSON-lines file, a corrupt line named in a ``UserError``.

A JSON-lines path ending in ``.gz`` is gzip (``write_jsonl`` and ``read_jsonl`` alike; pandas reads it by the
suffix too), written reproducibly: no file name and a zero time in its header, so the same records give the
same bytes.

The one line rule of every text file narbench reads (JSON lines, eval and translate inputs, your own
data, the corpora and TSVs it writes): a line ends at ``"\n"`` (a ``"\r"`` right before it belongs to
the ending, so Windows files read as Unix ones), and nothing else ends a line. U+2028, U+2029, U+0085,
form feed, vertical tab, ``\x1c``-``\x1e`` and a lone ``"\r"`` are ordinary characters, where
``str.splitlines()`` and Python's text files (universal newlines) would split; ``wc -l`` counts the
same lines. ``split_lines`` applies it to text in memory, ``read_lines`` / ``iter_lines`` to a file.
What ``write_jsonl`` writes keeps that rule: ``json.dumps`` escapes ``"\n"`` and ``"\r"`` in strings,
so each record is one physical line whatever its text holds.

Folders narbench replaces whole (``--force``) carry a stamp, ``.narbench`` (``stamp_folder``): only a
stamped folder (or an empty one, or one a caller recognises as its own older output) is ever deleted
to be replaced (``check_replaceable``, ``replace_folder``); anything else is a one-line ``UserError``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from narbench_core.errors import UserError


def _umask() -> int:
    """The process umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _file_mode() -> int:
    """``0o666`` less the process umask."""
    return 0o666 & ~_umask()


def _commit(tmp: str, path: Path) -> None:
    os.chmod(tmp, _file_mode())
    os.replace(tmp, path)


def temp_dir(parent: str | os.PathLike, prefix: str) -> Path:
    """A new, uniquely named folder in ``parent`` to fill and rename into place, with the permissions a
    plain ``mkdir`` gives (``0o777`` less the umask; ``mkdtemp`` alone gives ``0o700``)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


def new_folder(path: str | os.PathLike, fill: Callable[[Path], None]) -> Path:
    """Make the folder ``path`` (not there yet) whole or not at all: ``fill(tmp)`` writes into a hidden temporary
    sibling (``temp_dir``), which is then renamed to ``path``; a failure leaves nothing behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(path.parent, prefix=f".{path.name}.")
    try:
        fill(tmp)
        tmp.rename(path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """A temp file name next to ``path`` for a writer that takes a name; renamed into place on success.

    ``suffix`` lets libraries that add their own extension (``np.savez`` adds ``.npz``) find the file.
    The caller's writer must flush it; this fsyncs before the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        _commit(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """Open a temp file next to ``path`` for writing (``"w"``: UTF-8 text, ``"wb"``: bytes)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """One line per item (each ends with a newline), streamed."""
    with atomic_open(path, "w") as f:
        for line in lines:
            f.write(line + "\n")


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def json_default(value: Any) -> Any:
    """JSON for numpy scalars and arrays (by duck typing: the core imports no numpy), tuples,
    sets and paths."""
    if hasattr(value, "tolist") and hasattr(value, "dtype"):   # numpy scalar or array
        return value.tolist()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def write_json(path: str | os.PathLike, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=json_default) + "\n")


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """One JSON record a line; gzip (reproducible: ``GZIP_LEVEL``, no name, time 0) when ``path`` ends in .gz."""
    lines = (json.dumps(r, ensure_ascii=False, default=json_default) + "\n" for r in records)
    if str(path).endswith(".gz"):
        write_gzip_lines(path, lines)
        return
    with atomic_open(path, "w") as f:
        for line in lines:
            f.write(line)


GZIP_LEVEL = 6             # zlib's default: a tenth of level 9's time for a file 2% larger (samples.jsonl.gz)


def write_gzip_lines(path: str | os.PathLike, lines: Iterable[str | bytes]) -> None:
    """Lines (each with its newline) as a gzip file, whole or not at all, reproducibly (no name, time 0)."""
    import gzip

    with atomic_open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as f:
            for line in lines:
                f.write(line.encode("utf-8") if isinstance(line, str) else line)


def split_lines(text: str | bytes) -> list:
    r"""The lines of ``text`` (``str`` or ``bytes``) by the one line rule (module docstring): split at
    ``"\n"`` only, one ``"\r"`` before it dropped; a final ``"\n"`` ends the last line (it starts no
    empty one) and text after the last ``"\n"`` is a line of its own, kept as it is."""
    newline, cr = ("\n", "\r") if isinstance(text, str) else (b"\n", b"\r")
    lines = text.split(newline)
    tail = lines.pop()                       # after the last "\n": "" when the text ends with one
    out = [line[:-1] if line.endswith(cr) else line for line in lines]
    if tail:
        out.append(tail)
    return out


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file by the one line rule (``UnicodeDecodeError`` on other bytes)."""
    return split_lines(Path(path).read_bytes().decode("utf-8"))


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """``read_lines`` one line at a time, for files too large to hold."""
    with open(path, encoding="utf-8", newline="\n") as f:    # newline="\n": only "\n" ends a line, none translated
        for line in f:
            if line.endswith("\n"):
                line = line[:-2] if line.endswith("\r\n") else line[:-1]
            yield line


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a JSON-lines file ([] if absent); a corrupt line is a ``UserError`` naming it."""
    path = Path(path)
    if not path.is_file():
        return []
    if path.name.endswith(".gz"):
        return parse_jsonl(gunzip(path), path)
    with open(path, "rb") as f:
        return parse_jsonl(f, path)


def parse_jsonl(lines: Iterable[bytes] | bytes, path: str | os.PathLike) -> list[dict]:
    """The records of JSON lines (an iterable of byte lines, or bytes); a corrupt line names ``path`` and its
    number in a ``UserError``."""
    if isinstance(lines, bytes):
        lines = lines.split(b"\n")
    out = []
    for i, raw in enumerate(lines, 1):             # bytes: only b"\n" ends a line, and bad UTF-8 is this line's fault
        if not raw.strip():
            continue
        try:
            out.append(json.loads(raw.decode("utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            why = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8 text"
            raise UserError(f"{path}:{i}: not valid JSON ({why}); delete the file's run folder "
                            "and re-run") from None
    return out


def gunzip(path: str | os.PathLike) -> bytes:
    """A gzip file's whole content; a damaged or cut-off one is a ``UserError`` naming it (``gunzip_prefix`` reads
    what there is)."""
    data, whole = gunzip_prefix(path)
    if not whole:
        raise UserError(f"{path}: not a whole gzip file (cut off or damaged); delete the file's run folder and "
                        "re-run")
    return data


def gunzip_prefix(path: str | os.PathLike) -> tuple[bytes, bool]:
    """As much of a gzip file's content as can be read, and whether that is all of it (False: the file was cut
    off, or its bytes are damaged from some point on)."""
    import zlib

    out, d = [], zlib.decompressobj(16 + zlib.MAX_WBITS)
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return b"".join(out), d.eof and not d.unused_data
            try:
                out.append(d.decompress(chunk))
            except zlib.error:
                return b"".join(out), False
            if d.eof:
                return b"".join(out), not (d.unused_data or f.read(1))


STAMP = ".narbench"     # in every folder narbench may later delete to replace: says what wrote it


def stamp_folder(folder: str | os.PathLike, written_by: str) -> None:
    """Mark ``folder`` as narbench's (``written_by``: the command that wrote it), so ``--force`` may replace it."""
    write_json(Path(folder) / STAMP, {"written_by": written_by})


def check_replaceable(folder: str | os.PathLike, recognise: Callable[[Path], bool] | None = None,
                      hint: str = "pick another --out") -> None:
    """A one-line ``UserError`` unless the existing ``folder`` may be deleted to be replaced: narbench
    wrote it (its ``STAMP``, or ``recognise(folder)``: outputs from before the stamp), or it is empty."""
    path = Path(folder)
    if path.is_symlink() or not path.is_dir():
        kind = "a symbolic link" if path.is_symlink() else "a file"
        raise UserError(f"{path} is {kind}, not a folder narbench wrote; remove it yourself or {hint}")
    if (path / STAMP).is_file() or not any(path.iterdir()) or (recognise is not None and recognise(path)):
        return
    raise UserError(f"{path} was not written by narbench (no {STAMP} stamp); remove it yourself or {hint}")


def replace_folder(new: str | os.PathLike, old: str | os.PathLike, recognise: Callable[[Path], bool] | None = None,
                   hint: str = "pick another --out") -> None:
    """Rename the finished folder ``new`` to ``old``, deleting ``old`` first if it exists and
    ``check_replaceable`` allows it (else ``UserError``, ``old`` untouched)."""
    old = Path(old)
    if old.exists() or old.is_symlink():
        check_replaceable(old, recognise, hint)
        shutil.rmtree(old)
    os.rename(new, old)


def digest_files(root: Path, files: Iterable[Path]) -> str:
    """sha256 (16 hex digits) over ``files``' paths relative to ``root`` and their bytes, in the order given."""
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def file_digests(folder: str | os.PathLike) -> dict[str, list]:
    """``{name: [size, digest]}`` of every file directly in ``folder`` but narbench's records (``narbench.json``,
    the stamp) and hidden files: an export's files, recorded when written and checked when used."""
    folder = Path(folder)
    return {f.name: [f.stat().st_size, digest_files(folder, [f])] for f in sorted(folder.iterdir())
            if f.is_file() and f.name != "narbench.json" and not f.name.startswith(".")}


def write_export(out_dir: str | os.PathLike, fill: Callable[[Path], None], record: dict, written_by: str,
                 recognise: Callable[[Path], bool] | None = None) -> Path:
    """Write an exported model folder whole or not at all: ``fill(tmp)`` writes its files into a temporary
    sibling (the umask's permissions, like every folder), ``record`` goes to its ``narbench.json``, the
    stamp names ``written_by``, and the folder then replaces ``out_dir`` (``replace_folder``'s rules). The record
    gains ``files``: the size and digest of each file ``fill`` wrote (``file_digests``)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(out_dir.parent, prefix=out_dir.name + ".")
    try:
        fill(tmp)
        record = {**record, "files": file_digests(tmp)}
        (tmp / "narbench.json").write_text(json.dumps(record, indent=1, sort_keys=True))
        stamp_folder(tmp, written_by)
        replace_folder(tmp, out_dir, recognise=recognise)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir
