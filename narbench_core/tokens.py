"""Reserved token ids, shared by every SentencePiece vocabulary, model, loss and decoder.

A narbench vocabulary reserves the first four ids (``suites/vocab.py`` trains it so and checks it);
regular pieces start at ``FIRST_REGULAR_ID``.
"""

PAD_ID = 0              # padding; also the first decoder input (T5 starts decoding from it)
EOS_ID = 1              # end of sentence
UNK_ID = 2              # unknown piece
MASK_ID = 3             # ``<mask>``: PaDIR's masked position
MASK_PIECE = "<mask>"   # the user-defined piece that gets MASK_ID
FIRST_REGULAR_ID = 4    # ids below this are never emitted as text
