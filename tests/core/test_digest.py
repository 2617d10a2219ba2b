"""narbench_core.digest: the one hash helper gives the keys already on disk (pinned from before it existed)."""
from __future__ import annotations

import datetime

from narbench_core.digest import COMPACT, file_digest, json_digest, text_digest


def test_json_digest_keeps_every_callers_bytes():
    assert json_digest({"b": [1, 2.5], "a": "x"}, separators=COMPACT) == (
        "66efddae6a97500318e4c6cdc4bc04149f340a165a7ef2d830393048b67b7a31")          # spec hashes
    assert json_digest({"teacher": {"task": "t"}, "seed": 0}, 12) == "241a246d177d"   # distillation folders
    assert text_digest("abc", 10) == "ba7816bf8f"


def test_cache_keys_are_the_ones_on_disk(tmp_path):
    from pathlib import Path

    from models import train
    from suites import synthetic, vocab
    from theory import writer

    assert synthetic.SyntheticConfig().key() == "ea58d431d58b"
    assert train._digest({"a": 1, "b": [1.5, "x"], "p": Path("/x")}) == "281557efd555"    # checkpoint folders
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert writer.run_id_for({"k": [1, 2]}, when) == "20260102T030405Z-3a1a6df5"
    f = tmp_path / "a.txt"
    f.write_bytes(b"hallo welt\nhello world\n")
    assert file_digest(f) == "f33b2302f6df5ecf4f9cb77d178ed5dd5a35591acfc77d94a30400e645a19d51"
    assert vocab.vocab_key([f], vocab.VocabSettings(vocab_size=100), [1]) == "f11f4477b4a3b4c0"
