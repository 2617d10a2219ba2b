"""A trained SentencePiece model as the small text API decoders use, without seqio or TensorFlow.

A decoder needs ``encode``, ``decode``, ``vocab_size`` and the ``tokenizer`` (the SentencePiece
processor); ``seqio.SentencePieceVocabulary`` gives the same four, but importing seqio loads
TensorFlow (~0.7 GB and ~10 s per process). A timing worker holds one decoder each, so decoders
built from a checkpoint read their vocabulary through this module. ``decode`` follows seqio's
contract (ids past the vocabulary read as unk; text ends at the first EOS), so both give the same
strings for the same ids.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import sentencepiece as spm

from narbench_core.errors import UserError
from narbench_core.tokens import EOS_ID, MASK_ID, MASK_PIECE, PAD_ID, UNK_ID


class SentencePieceText:
    """Encode and decode with one SentencePiece model file (narbench's id layout)."""

    def __init__(self, model_file: str | Path):
        self.model_file = str(model_file)
        self.tokenizer = spm.SentencePieceProcessor(model_file=self.model_file)
        sp = self.tokenizer
        if (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) != (PAD_ID, EOS_ID, UNK_ID, -1) or \
                sp.piece_to_id(MASK_PIECE) != MASK_ID:
            raise UserError(f"{model_file} is not a narbench vocabulary (ids pad/EOS/unk/<mask> = "
                            f"{PAD_ID}/{EOS_ID}/{UNK_ID}/{MASK_ID}); rebuild it with `narbench data prepare`")
        self.vocab_size = sp.get_piece_size()
        self.eos_id, self.unk_id = EOS_ID, UNK_ID

    @property
    def sentencepiece_model_file(self) -> str:
        """The model file, by seqio's name for it (``catalog.TaskInfo.vocab_path`` reads either vocabulary)."""
        return self.model_file

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without EOS."""
        return self.tokenizer.encode_as_ids(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS (ids past the vocabulary read as unk)."""
        clean = [UNK_ID if int(i) >= self.vocab_size else int(i) for i in ids]
        if EOS_ID in clean:
            clean = clean[: clean.index(EOS_ID) + 1]
        return self.tokenizer.decode_ids(clean)
