"""Shared defaults: the one home of every default that more than one module needs.

Suite specs override them per suite; a command-line flag overrides them per command.
"""

# -- AR decoding -------------------------------------------------------------------------------------
BEAM_SIZE = 5                  # the paper's beam
LENGTH_PENALTY = 0.6           # GNMT / t5x brevity penalty alpha for beam search

# -- PaDIR decoding and training ---------------------------------------------------------------------
LENGTH_HYPS = 5                # length hypotheses refined in parallel (the paper's k)
REMASK = "stutter"             # re-mask the later copies of consecutive repeats between passes
REMASK_MODES = ("none", "stutter", "mask-predict")
INIT = "random"                # initial hypothesis: uniform random regular tokens
INIT_MODES = ("random", "mask")
UNMASK_RATE = 0.15             # share of target tokens kept correct in training noise
STAGES = 2                     # training stages (stage 2 refines stage 1's argmax)
POSITIONAL_ATTENTION = True    # the positional-attention sublayer

# -- distillation ------------------------------------------------------------------------------------
DISTILL_BEAM_SIZE = BEAM_SIZE  # the teacher's beam
DISTILL_MAX_EXAMPLES = None    # training sources the teacher decodes (None: all)

# -- shapes ------------------------------------------------------------------------------------------
DECODE_BUCKETS = (16, 32, 64, 128)                 # source-length shape buckets of a decoder
TRAIN_BUCKETS = (16, 24, 32, 40, 48, 64, 96, 128)  # sequence-length buckets of the training batcher
