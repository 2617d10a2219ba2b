"""Shared defaults: the one home of every default that more than one module needs.

Suite specs override them per suite; a command-line flag overrides them per command.
"""

# -- AR decoding -------------------------------------------------------------------------------------
BEAM_SIZE = 5                  # the paper's beam
LENGTH_PENALTY = 0.6           # GNMT / t5x brevity penalty alpha for beam search

# -- PaDIR decoding and training ---------------------------------------------------------------------
LENGTH_HYPS = 5                # length hypotheses refined in parallel (the paper's k)
LENGTH_BONUS = 0               # tokens added to every predicted length (a decoding knob, set on dev)
REMASK = "stutter"             # re-mask the later copies of consecutive repeats between passes
REMASK_MODES = ("none", "stutter", "mask-predict")
START = "random"                # initial hypothesis: uniform random regular tokens
START_MODES = ("random", "mask")
UNMASK_RATE = 0.15             # share of target tokens kept correct in training noise
STAGES = 2                     # training stages (stage 2 refines stage 1's argmax)
INIT = "random"                # PaDIR parameters: "random", or "ar": warm-started from the suite's AR model
INIT_MODES = ("random", "ar")
RECIPE = "reference"           # "reference": google-research padir/'s fixed EOS, [LENGTH] query and stage-2
RECIPES = ("plain", "reference")   # remasking; "plain": none of the three
POSITIONAL_ATTENTION = True    # the positional-attention sublayer
LENGTH_PREDICTOR = "absolute"  # PaDIR's length classes: "absolute" lengths (the paper), or "offset" from the
LENGTH_PREDICTORS = ("absolute", "offset")   # source length (fairseq's NAT models)
GLANCING = False               # glancing training (GLAT, Qian et al. 2021)
GLANCE_START, GLANCE_END = 0.5, 0.3   # its glancing ratio, annealed linearly over the training steps

# -- distillation ------------------------------------------------------------------------------------
DISTILL_DECODER = f"beam:{BEAM_SIZE}"  # the teacher's search: "greedy" or "beam:K"
DISTILL_MAX_EXAMPLES = None    # training sources the teacher decodes (None: all but the held-aside slice)
DISTILL_HELDOUT = 500          # training pairs held aside (never distilled) to score the teacher's BLEU
DISTILL_BATCH_SIZE = 32        # sentences per teacher batch, sources sorted by length (docs/experiments.md)
DISTILL_ENGINES = ("jax", "ct2")  # the teacher runs in narbench's JAX decoder or in CTranslate2 (the ct2 extra)
DISTILL_ENGINE = "jax"

# -- when training stops (models/schedule.py) ------------------------------------------------------
TRAIN_UNTIL = ("steps", "plateau")    # train `steps` steps, or until dev BLEU stops rising (`steps` a cap)
# The curve value a plateau rule reads, and its direction: +1 a rise is progress (dev BLEU), -1 a fall (dev NLL).
PLATEAU_SIGNALS = {"dev_bleu": 1, "dev_nll": -1}
LR_SCHEDULES = ("cosine", "wsd")      # after warm-up: cosine to the floor at `steps`, or warmup-stable-decay

# -- cached checkpoints (models/train.py) -----------------------------------------------------------
RETRAIN_DAMAGED = True         # a damaged checkpoint narbench is asked to train (truncated files): moved aside
                               # to <folder>.damaged and retrained; False (--refuse-damaged): a one-line error

# -- folder locks (narbench_core/lock.py) -------------------------------------------------------------
LEASE_HEARTBEAT_S = 10         # a process holding a folder refreshes its lock file's mtime this often (s) ...
LEASE_STALE_S = 120            # ... and a lock from another host with no refresh for this long is stale: taken
                               # over (the hosts' and the file server's clocks must agree to well within it)
LEASE_POLL_S = 2               # a process waiting for a held folder (wait=True) looks at its lock this often (s)

# -- learning curves (every training evaluates on the dev split at regular intervals) -----------------
CURVE_POINTS = 5               # a suite's default: evaluate every steps // CURVE_POINTS steps
CURVE_SENTENCES = 200          # dev sentences per point (a seeded sample of the dev split)
CURVE_REFINE_STEPS = 4         # PaDIR points decode with refine:CURVE_REFINE_STEPS (AR: greedy) ...
CURVE_LENGTH_HYPS = 1          # ... and one length hypothesis: a curve shows the trend (docs/experiments.md)
CURVE_RISE = 0.5               # "still improving": dev BLEU rose by more than this ...
CURVE_TAIL = 0.2               # ... over this last share of the training steps

# -- executors (`narbench run --executor`, bench.executors) ----------------------------------------------
EXECUTOR = "local"             # local: every training in this process; ray: on a Ray cluster
RAY_MAX_RETRIES = 3            # a Ray job is run again this many times when its worker or node is lost
RAY_CPUS_PER_JOB = 1           # the CPUs Ray reserves for one training or distillation job
RAY_OBJECT_STORE_BYTES = 200 * 2**20   # a local Ray instance's object store: jobs pass paths and records only
RAY_TIMING_RESOURCE = "narbench_timing"  # a Ray node offering this custom resource times the suite's systems

# -- significance (sacrebleu's paired tests of BLEU against the baseline, bench.measure.quality) --------
AR_TRIALS = 10_000             # approximate randomization trials (sacrebleu's default; the paired bootstrap's
                               # resamples are the suite's `bootstrap_resamples`, default 1000 as sacrebleu's)
SIGNIFICANCE_SEED = 12345      # sacrebleu's own default SACREBLEU_SEED, so `sacrebleu --paired-ar` run by hand
                               # gives the same p-values (sacrebleu leaves its tests unseeded for 0)

# -- timing -----------------------------------------------------------------------------------------
SAYS_BLEU_MARGIN = 1.0          # a leaderboard's summary names the fastest system within this much BLEU of the best,
                               # and the fastest NAR within it of AR greedy (which judges the paper's speed claim)
LEARNED_BLEU = 5.0             # a baseline (AR greedy) below this test BLEU has not learned the task: the
                               # leaderboard says so and shows no speedups against it
LOAD_SAMPLE_S = 1.0            # seconds the machine's load is sampled before each timed measurement (bench.measure.load)
# Other processes took more of the CPU than this while timing: warned, and noted on the page. Measured 2026-11-29 on a
# 2-core Intel Xeon (KVM guest): the default suite's models, 150 test sentences, a foreign spinner at a duty cycle,
# each load timed between two idle timings (their mean the reference, as the machine's own speed drifted by 8-16%
# between idle timings minutes apart): at others = 0.06 of the machine every system ran 8-26% slower; at 0.12 and
# 0.49 the 2-thread JAX systems ran 5-46% slower, the 1-thread CTranslate2 and ONNX Runtime ones within the drift.
BUSY_SHARE = 0.05
INTERFERENCE_OK = (0.9, 1.1)   # in-suite p50 / solo p50 outside this range: the leaderboard flags the row

# -- shapes ------------------------------------------------------------------------------------------
DECODE_BUCKETS = (16, 32, 64, 128)                 # source-length shape buckets of a decoder
TRAIN_BUCKETS = (16, 24, 32, 40, 48, 64, 96, 128)  # sequence-length buckets of the training batcher
