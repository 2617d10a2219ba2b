"""Decoders: prepare / run / finish with tiny random models and a tiny SentencePiece vocabulary."""
from __future__ import annotations

import math
import re
import jax
import numpy as np
import pytest

from narbench_core.errors import UserError
from models import decoders

SOURCES = ["the river and the stone", "alpha beta", "she was in the house of light and water"]
OPTS = dict(buckets=(16,), max_decode_length=16)


def roundtrip(decoder, sources=SOURCES):
    prepared = decoder.prepare(sources)
    outputs = decoder.run(prepared)
    jax.block_until_ready(outputs)
    return decoder.finish(outputs, prepared)


@pytest.fixture(scope="module")
def ar_greedy(ar_config, ar_params, tiny_vocab):
    return decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", **OPTS)


def test_ar_greedy_roundtrip(ar_greedy):
    assert ar_greedy.name == "greedy"   # system names are the harness families'; a decoder defaults to its spec
    out = roundtrip(ar_greedy)
    assert len(out.hypotheses) == 3 and all(isinstance(h, str) for h in out.hypotheses)
    assert out.passes.shape == (3,) and np.all((out.passes >= 1) & (out.passes <= 16))
    # Deterministic, and a sentence's output does not depend on its batch-mates.
    again = roundtrip(ar_greedy, SOURCES[1:2])
    assert again.hypotheses[0] == out.hypotheses[1]


def test_ar_greedy_uncached_matches_cached(ar_config, ar_params, tiny_vocab, ar_greedy):
    uncached = decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", cached=False, **OPTS)
    a, b = roundtrip(ar_greedy), roundtrip(uncached)
    assert a.hypotheses == b.hypotheses
    np.testing.assert_array_equal(a.passes, b.passes)


def test_ar_beam_and_lowering(ar_config, ar_params, tiny_vocab):
    beam = decoders.make_decoder(ar_config, ar_params, tiny_vocab, "beam:2", name="ar-beam2", **OPTS)
    assert beam.name == "ar-beam2" and beam.parsed.k == 2
    out = roundtrip(beam)
    assert len(out.hypotheses) == 3
    warm = beam.warmup_inputs(1)
    assert len(warm) == 1 and warm[0].inputs.shape == (1, 16)
    for part in ("encode", "pass"):
        cost = beam.lower(warm[0], part).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost             # jax versions differ
        assert cost["flops"] > 0 and cost["bytes accessed"] > 0
    with pytest.raises(UserError):
        beam.lower(warm[0], "everything")


def test_ar_beams_attend_to_their_source_once(ar_config, ar_params, tiny_vocab):
    """Beam search gives the beams of a sentence its encoding once (the cross-attention groups them):
    the same beams and scores as with the encoding repeated for every beam."""
    import jax.numpy as jnp

    from models import decoding, t5

    beam = decoders.make_decoder(ar_config, ar_params, tiny_vocab, "beam:3", **OPTS)
    prepared = beam.prepare(SOURCES)
    inputs, active = jnp.asarray(prepared.inputs), jnp.asarray(prepared.active)
    (b, s), k, max_len = inputs.shape, 3, beam.max_len(inputs.shape[1])
    encoded = beam._encode_jit(beam.params, inputs)

    @jax.jit
    def repeated(encoded, inputs):
        enc, inp = jnp.repeat(encoded, k, axis=0), jnp.repeat(inputs, k, axis=0)           # [b*k, ...]
        fn = lambda tok, c: beam._step(beam.params, c, enc, inp, tok)
        return decoding.beam_search(fn, t5.init_cache(ar_config, b * k, s, max_len), b, k, max_len,
                                    beam.length_penalty, active=active)

    grouped, old = beam.run(prepared), repeated(encoded, inputs)
    np.testing.assert_array_equal(np.asarray(grouped.tokens), np.asarray(old.tokens[:, 0]))
    np.testing.assert_allclose(np.asarray(grouped.score), np.asarray(old.scores[:, 0]), rtol=1e-5, atol=1e-5)


def test_count_truncated_counts_the_sources_prepare_cuts(ar_greedy, tiny_vocab):
    """A source of more than max_source_tokens - 1 tokens is cut to them plus EOS; count_truncated says how many."""
    long = " ".join(["river stone"] * 20)
    assert ar_greedy.max_source_tokens == 16 and len(tiny_vocab.encode(long)) > 15
    sources = [SOURCES[0], long, SOURCES[1]]
    assert ar_greedy.count_truncated(sources) == 1 and ar_greedy.count_truncated(SOURCES) == 0
    row = ar_greedy.prepare(sources).inputs[1]
    assert list(row) == list(tiny_vocab.encode(long))[:15] + [decoders.EOS_ID]


def test_warmed_batch_size_pads_small_batches(ar_greedy):
    ar_greedy.warmup_inputs(4)
    prepared = ar_greedy.prepare(SOURCES)
    assert prepared.inputs.shape == (4, 16) and prepared.num_sources == 3
    assert len(ar_greedy.finish(ar_greedy.run(prepared), prepared).hypotheses) == 3


@pytest.mark.parametrize("remask,start", [("stutter", "random"), ("mask-predict", "mask")])
def test_padir_refine_roundtrip(padir_config, padir_params, tiny_vocab, remask, start):
    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:3", length_hyps=2,
                                remask=remask, start=start, **OPTS)
    assert dec.parsed.k == 3 and dec.length_hyps == 2 and dec.remask == remask
    warm = dec.warmup_inputs(1)
    assert {w.target_bucket for w in warm} == {16}
    out = roundtrip(dec)
    assert len(out.hypotheses) == 3
    assert np.all((out.passes >= 1) & (out.passes <= 3))
    cost = dec.lower(warm[0], "pass").compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["flops"] > 0                                              # one pass computes something


def test_padir_at_given_lengths_is_padir_forced_to_them(padir_config, padir_params, tiny_vocab):
    """``run_at_lengths`` (the oracle-length diagnostic) refines every hypothesis of a row at its given length:
    at one length for all it gives the tokens of a decoder forced to that length; each row's tokens end at its
    own length (``keep_repeats``: the raw tokens, nothing dropped)."""
    def tokens(decoder, lengths=None):
        prepared = decoder.prepare(SOURCES)
        out = decoder.run(prepared) if lengths is None else decoder.run_at_lengths(prepared, lengths)
        return np.asarray(jax.device_get(out.tokens))[:len(SOURCES)]

    free = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", keep_repeats=True, **OPTS)
    forced = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", keep_repeats=True,
                                   force_length=6, **OPTS)
    np.testing.assert_array_equal(tokens(free, [6, 6, 6]), tokens(forced))
    uneven = tokens(free, [3, 5, 9])
    assert all(not row[n:].any() for row, n in zip(uneven, [3, 5, 9]))
    dropped = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", **OPTS)
    assert len(roundtrip(dropped).hypotheses) == 3 and dropped.keep_repeats is False


def test_spec_and_option_errors(ar_config, ar_params, padir_config, padir_params, tiny_vocab):
    with pytest.raises(UserError, match="needs an AR checkpoint; use refine:T"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "beam:4")
    with pytest.raises(UserError, match="needs a PaDIR checkpoint; use greedy or beam:K"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "refine:4")
    with pytest.raises(UserError, match=">= 1"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:0")
    with pytest.raises(UserError, match="unknown decoder"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "sample")
    with pytest.raises(UserError, match="unknown remask"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", remask="sometimes")
    with pytest.raises(UserError, match=r"options \['temperature'\] do not apply"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", temperature=0.5)
    with pytest.raises(UserError, match=r"options \['length_hyps'\] do not apply to an AR checkpoint"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", length_hyps=5)


def test_load_decoder_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoint"):
        decoders.load_decoder(tmp_path / "missing", "greedy")
    with pytest.raises(UserError, match="refine:T"):
        decoders.load_decoder(tmp_path / "missing", "refine:x")


def test_load_decoder_from_checkpoint_folder(tmp_path, ar_config, ar_params, tiny_vocab):
    from models import checkpoint

    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, 5, ar_params, {"count": np.zeros((), np.int32)})
    checkpoint.write_meta(ckpt, {"task": "toy", "kind": "ar", "model_config": ar_config.to_dict(),
                                 "train_config": {"steps": 5}, "vocab_path": tiny_vocab.sentencepiece_model_file,
                                 "steps_done": 5, "complete": True})
    dec = decoders.load_decoder(ckpt, "greedy", **OPTS)
    assert dec.name == "greedy"
    with pytest.raises(UserError, match="needs a PaDIR checkpoint"):
        decoders.load_decoder(ckpt, "refine:2")
    out = roundtrip(dec)
    assert len(out.hypotheses) == 3
    # A model's decoders in one process (a timing worker's) share its parameters; a checkpoint saved again loads again.
    beam = decoders.load_decoder(ckpt, "beam:2", **OPTS)
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(beam.params), jax.tree_util.tree_leaves(dec.params)))
    checkpoint.save(ckpt, 6, jax.tree_util.tree_map(lambda x: x + 1, ar_params), {"count": np.zeros((), np.int32)})
    checkpoint.write_meta(ckpt, {**checkpoint.read_meta(ckpt), "steps_done": 6})
    again = decoders.load_decoder(ckpt, "greedy", **OPTS)
    assert jax.tree_util.tree_leaves(again.params)[0] is not jax.tree_util.tree_leaves(dec.params)[0]
    first = jax.tree_util.tree_leaves(dec.params)[0]
    assert np.allclose(jax.tree_util.tree_leaves(again.params)[0], np.asarray(first) + 1)


def test_batch_padding_rows_do_not_extend_the_loop(ar_greedy, padir_config, padir_params, tiny_vocab):
    # A padding row starts finished: 0 passes, so it never keeps the loop running.
    ar_greedy.warmup_inputs(4)
    prepared = ar_greedy.prepare(SOURCES[:1])
    out = ar_greedy.run(prepared)
    assert list(np.asarray(out.passes)[1:]) == [0, 0, 0] and int(np.asarray(out.tokens)[1:].max()) == 0
    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", length_hyps=1, **OPTS)
    dec.warmup_inputs(2)
    prepared = dec.prepare(SOURCES[:1])
    assert prepared.inputs.shape[0] == 2
    out = dec.run(prepared)
    assert list(np.asarray(out.passes)) == [int(dec.finish(out, prepared).passes[0]), 0]


@pytest.mark.parametrize("spec,opts", [("greedy", {}), ("greedy", {"cached": False}), ("beam:2", {})])
def test_ar_force_length_decodes_exactly_that_many_tokens(ar_config, ar_params, tiny_vocab, spec, opts):
    dec = decoders.make_decoder(ar_config, ar_params, tiny_vocab, spec, force_length=5, **opts, **OPTS)
    prepared = dec.prepare(SOURCES)
    out = dec.run(prepared)
    assert out.tokens.shape == (3, 5) and out.score.shape == (3,)
    np.testing.assert_array_equal(out.passes, [5, 5, 5])
    assert list(dec.finish(out, prepared).passes) == [5, 5, 5]


def test_force_length_must_fit_the_max_decode_length(ar_config, ar_params, padir_config, padir_params, tiny_vocab):
    for config, params, spec in ((ar_config, ar_params, "greedy"), (padir_config, padir_params, "refine:2")):
        with pytest.raises(UserError, match=r"force_length must be in \[1, 16\]"):
            decoders.make_decoder(config, params, tiny_vocab, spec, force_length=17, **OPTS)


def test_padir_force_length_and_no_early_stop(padir_config, padir_params, tiny_vocab):
    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:3", length_hyps=2, force_length=5,
                                early_stop=False, buckets=(8, 16), max_decode_length=16)
    assert dec.target_buckets(16) == [8] and {w.target_bucket for w in dec.warmup_inputs(1)} == {8}
    prepared = dec.prepare(SOURCES)
    out = dec.run(prepared)
    np.testing.assert_array_equal(out.passes, [3, 3, 3])                       # no early stop: exactly T
    assert out.tokens.shape == (3, 8)
    history = dec.refine_with_history(prepared).history
    np.testing.assert_array_equal(history.mask.sum(axis=1), [5, 5, 5])       # every hypothesis has length 5
    assert bool(history.active.all()) and history.aux is None


def test_padir_history_is_the_run_plus_every_pass(padir_config, padir_params, tiny_vocab):
    from models import refine

    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:3", length_hyps=2, **OPTS)
    prepared = dec.prepare(SOURCES)
    out = dec.run(prepared)
    full = dec.refine_with_history(prepared, attention=True)
    for field in ("tokens", "passes", "score"):
        np.testing.assert_array_equal(getattr(full, field), getattr(out, field))
    h = jax.device_get(full.history)
    heads, n = padir_config.num_heads, out.tokens.shape[1]
    assert h.tokens.shape == (3, 3, n) and h.active.shape == (3, 3)
    assert h.aux["self_attention"].shape == (3, 3, heads, n, n)
    assert h.aux["cross_attention"].shape == (3, 3, heads, n, prepared.inputs.shape[1])
    last = h.active.sum(axis=0) - 1                                             # the best hypothesis's final pass
    assert ((last >= 0) & (last < np.asarray(out.passes))).all()                 # passes: max over hypotheses
    final = h.tokens[last, np.arange(3)]                                          # [B, n] before repeat-dropping
    np.testing.assert_array_equal(refine.drop_repeats(final, h.mask), out.tokens)
    for r in range(3):
        n_r = int(h.mask[r].sum())
        weights = h.aux["self_attention"][last[r], r, :, :n_r]                    # [heads, n_r, n]
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-4)
        assert np.abs(weights[..., n_r:]).max() < 1e-6                            # masked positions get nothing


def test_timed_decoders_split_their_time_into_phases(ar_greedy, padir_config, padir_params, tiny_vocab):
    """Timed by bench.measure.timing, AR and PaDIR mark their encoder's end (and PaDIR its length read-back);
    each call's phases add up to its latency, and untimed runs give the same translations."""
    from bench.measure import timing

    padir = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", length_hyps=2, name="p",
                                  **OPTS)
    timing.warmup([ar_greedy, padir])
    m = timing.measure([ar_greedy, padir], SOURCES)
    expected = {ar_greedy.name: ({"tokenize", "encode", "host_sync", "passes", "detokenize"}, 2),
                "p": ({"tokenize", "encode", "host_sync", "passes", "detokenize"}, 2)}
    for name, (keys, syncs) in expected.items():
        t = m.systems[name]
        assert all(set(d) == keys for d in t.phase_ms)
        np.testing.assert_array_equal(t.host_syncs, [syncs] * len(SOURCES))
        np.testing.assert_allclose([sum(d.values()) for d in t.phase_ms], t.latencies_ms, rtol=1e-9)
    for dec in (ar_greedy, padir):          # batch size 1, as timed (PaDIR's random start depends on the batch)
        assert m.systems[dec.name].hypotheses == [roundtrip(dec, [s]).hypotheses[0] for s in SOURCES]


def test_padir_length_bonus_shifts_every_hypothesis(padir_config, padir_params, tiny_vocab):
    import jax.numpy as jnp

    def lengths(bonus):
        dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", length_hyps=3,
                                    length_bonus=bonus, **OPTS)
        return np.asarray(dec._encode(dec.params, jnp.asarray(dec.prepare(SOURCES).inputs))[1])   # [b, k]

    base = lengths(0)
    np.testing.assert_array_equal(lengths(2), np.minimum(base + 2, 16))        # clipped at the max decode length
    np.testing.assert_array_equal(lengths(-40), np.ones_like(base))            # and at 1
    with pytest.raises(UserError, match="length_bonus must be a whole number"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", length_bonus=1.5, **OPTS)


def _computations(hlo: str) -> dict[str, str]:
    """An optimised HLO module's text split into its computations: name -> text (the entry: "ENTRY")."""
    out = {}
    for block in re.split(r"\n\n+", hlo):
        head = block.lstrip().split(" ", 1)[0]
        out["ENTRY" if head == "ENTRY" else head.lstrip("%")] = block
    return out


def _dots(blocks: dict[str, str], root: str) -> list[str]:
    """The op names of every dot in computation ``root`` and the computations it calls."""
    seen, todo, names = set(), [root], []
    while todo:
        name = todo.pop()
        if name in seen or name not in blocks:
            continue
        seen.add(name)
        text = blocks[name]
        names += re.findall(r"= \S+ dot\(.*?op_name=\"([^\"]+)\"", text)
        todo += re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", text)
    return names


def test_padir_loop_holds_only_hypothesis_dependent_work(padir_config, padir_params, tiny_vocab):
    """XLA hoists the source's cross-attention keys/values and the positional attention's queries/keys
    out of the refinement loop: their matmuls run once per call, whatever T (optimised HLO)."""
    import jax.numpy as jnp

    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:3", length_hyps=2, **OPTS)
    prepared = dec.prepare(SOURCES)
    inputs = jnp.asarray(prepared.inputs)
    encoded, lengths = dec._encode(dec.params, inputs)
    hlo = dec._refine.lower(dec.params, encoded, inputs, lengths, jnp.asarray(prepared.active), dec.rng,
                            dec._num_iterations, capacity=16).compile().as_text()
    blocks = _computations(hlo)
    loops = re.findall(r"while\(.*?body=%([\w.\-]+)", blocks["ENTRY"])
    loop = max(loops, key=lambda name: len(_dots(blocks, name)))               # the refinement loop
    inside, everywhere = _dots(blocks, loop), _dots(blocks, "ENTRY")
    for op in ("encoder_decoder_attention/key/", "encoder_decoder_attention/value/",
               "positional_attention/query/", "positional_attention/key/"):
        assert any(op in n for n in everywhere) and not any(op in n for n in inside), op
    # The hypothesis-dependent work stays inside: self-attention, cross-attention queries, the output.
    for op in ("self_attention/query/", "encoder_decoder_attention/query/", "token_embedder.attend/"):
        assert any(op in n for n in inside), (op, sorted(set(inside))[:5])
    # The keys/values are projected once per sentence, not once per length hypothesis: their dots
    # produce b * s * heads * head_dim values (b = 3 sentences), not k = 2 times as many.
    cfg, (b, s) = padir_config, prepared.inputs.shape
    for op in ("encoder_decoder_attention/key/", "encoder_decoder_attention/value/"):
        sizes = [math.prod(int(d) for d in dims.split(",") if d)
                 for dims, name in re.findall(r"= f32\[([\d,]*)\]\S* dot\(.*?op_name=\"([^\"]+)\"", hlo) if op in name]
        assert sizes and set(sizes) == {b * s * cfg.num_heads * cfg.head_dim}, (op, sizes)


def test_padir_pass_attends_from_k_hypotheses_as_from_k_copies_of_the_source(padir_config, padir_params):
    """A pass over k hypotheses of each source, given each source once, equals the pass given the
    source repeated k times (the cross-attention groups a source's hypotheses; the queries never interact)."""
    import jax.numpy as jnp

    from models import t5

    model, k, n = t5.make_model(padir_config), 3, 7
    rng = np.random.default_rng(0)
    inputs = jnp.asarray([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]], jnp.int32)            # [b, s]
    tokens = jnp.asarray(rng.integers(4, padir_config.vocab_size, (2 * k, n)), jnp.int32)  # [b*k, n]
    mask = jnp.asarray((np.arange(n)[None, :] < rng.integers(2, n + 1, (2 * k, 1))), jnp.int32)
    v = {"params": padir_params}
    encoded = model.apply(v, inputs, method=t5.PaDIR.encode)

    @jax.jit
    def run(enc, inp):
        logits, state = model.apply(v, enc, inp, tokens, mask, method=t5.PaDIR.refine, mutable=["intermediates"])
        return logits, state["intermediates"]["decoder"]["cross_attention"][0]

    grouped, repeated = run(encoded, inputs), run(jnp.repeat(encoded, k, 0), jnp.repeat(inputs, k, 0))
    for a, b in zip(grouped, repeated):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError, match="whole number of hypotheses"):
        model.apply(v, encoded, inputs, tokens[:5], mask[:5], method=t5.PaDIR.refine)


def test_a_beam_wider_than_the_vocabulary_is_one_line(ar_config, ar_params, tiny_vocab):
    """`--decoder beam:99999` built 99,999 rows of KV cache a sentence until memory ran out (issue 53)."""
    widest = ar_config.vocab_size - 4                                  # the tokens a step can choose from
    with pytest.raises(UserError, match=rf"^decoder beam:99999: the beam cannot be wider than the {widest} tokens"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "beam:99999", **OPTS)
    assert decoders.make_decoder(ar_config, ar_params, tiny_vocab, f"beam:{widest}", **OPTS).parsed.k == widest
