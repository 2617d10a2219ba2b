"""The one line rule (``narbench_core.io``): lines end at "\\n" (a "\\r" before it belongs to the
ending) and nothing else ends one; every JSON line narbench writes is one physical line."""
from __future__ import annotations

import json

from hypothesis import example, given, settings, strategies as st

from narbench_core.io import iter_lines, read_jsonl, read_lines, split_lines, write_jsonl, write_lines

# Every code point str.splitlines() or universal newlines treat as a line break, and "\n" itself.
BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# Arbitrary text (any code point UTF-8 can hold: no lone surrogates), biased towards the line-breaking ones.
TEXT = st.text(alphabet=st.one_of(st.sampled_from(BREAKS), st.sampled_from("ab \t"), st.characters(codec="utf-8")),
               max_size=30)
# One line's text: anything but "\n", and not ending in "\r" (which a "\n" after it would take as its ending).
LINE = TEXT.map(lambda s: s.replace("\n", "").rstrip("\r"))


def test_split_lines_ends_lines_at_newline_only():
    text = "a\u2028b\nc\rd\r\ne\x85f\x0cg\x0bh\x1c\x1d\x1ei\u2029j\n"
    assert text.splitlines() != split_lines(text)                   # what narbench did before
    assert split_lines(text) == ["a\u2028b", "c\rd", "e\x85f\x0cg\x0bh\x1c\x1d\x1ei\u2029j"]
    assert split_lines(text.encode()) == [x.encode() for x in split_lines(text)]
    assert split_lines("") == [] and split_lines("\n") == [""] and split_lines("a\n\nb") == ["a", "", "b"]
    assert split_lines("last\r") == ["last\r"]                      # no "\n": no ending to strip


@settings(max_examples=60, deadline=None)
@given(st.lists(LINE, max_size=8), st.sampled_from(["\n", "\r\n"]))
@example(["a\rb", "c\u2028d", "\x0c", "e\x85f"], "\n")
def test_files_read_back_line_for_line(tmp_path_factory, lines, ending):
    path = tmp_path_factory.mktemp("lines") / "x.txt"
    path.write_bytes("".join(line + ending for line in lines).encode("utf-8"))
    assert read_lines(path) == lines and list(iter_lines(path)) == lines
    assert path.read_bytes().count(b"\n") == len(lines)            # wc -l agrees
    write_lines(path, lines)
    assert read_lines(path) == lines and list(iter_lines(path)) == lines


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["name", "source", "x"]), TEXT, min_size=1), max_size=6))
@example([{"name": "my\u2028set"}, {"source": "a\rb\nc\x85"}])
def test_each_json_record_is_one_physical_line(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("jsonl") / "x.jsonl"
    write_jsonl(path, records)
    data = path.read_bytes()
    assert data.count(b"\n") == len(records)
    assert [json.loads(line) for line in data.decode("utf-8").split("\n")[:-1]] == records
    assert read_jsonl(path) == records
