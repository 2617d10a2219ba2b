"""CTranslate2: the export from Flax parameters (log-probs agree with narbench's AR model), greedy
agreement on a tiny trained model, int8, the one-line error without the extra, and the family."""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import checkpoint, ct2, decoders, t5
from models.batching import TokenPairs
from models.config import preset
from models.train import TrainConfig, train
from narbench_core.errors import UserError
from narbench_core.tokens import EOS_ID

pytest.importorskip("ctranslate2", reason="the ct2 extra is part of the dev extras: pip install -e '.[dev]'")


def teacher_forced_log_probs(config, params, pairs: list[tuple[list[int], list[int]]]) -> list[np.ndarray]:
    """narbench's AR model: log p(target token | prefix, source) for every target token (EOS included), of each
    (source ids, target ids) pair; one jitted call on the pairs padded to one shape (padding is masked: a row's
    real positions do not see it)."""
    model = t5.make_model(config)
    src = np.zeros((len(pairs), max(len(s) for s, _ in pairs)), np.int32)
    tgt = np.zeros((len(pairs), max(len(t) for _, t in pairs)), np.int32)
    for i, (s, t) in enumerate(pairs):
        src[i, :len(s)], tgt[i, :len(t)] = s, t

    @jax.jit
    def log_probs(params, src, tgt):
        logits = model.apply({"params": params}, src, t5.shift_right(tgt))
        lp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)                      # [b, L, V]
        return jnp.take_along_axis(lp, tgt[..., None], axis=-1)[..., 0]             # [b, L]

    out = np.asarray(log_probs(params, src, tgt))
    return [out[i, :len(t)] for i, (_, t) in enumerate(pairs)]


def test_export_matches_teacher_forced_log_probs(ar_config, ar_params, tiny_vocab, tmp_path, toy_sentences):
    spec = ct2.build_spec(ar_config, ar_params, ct2.vocabulary_pieces(tiny_vocab))
    spec.validate()
    spec.optimize(quantization=None)
    (tmp_path / "m").mkdir()
    spec.save(str(tmp_path / "m"))
    translator = ct2.translator(tmp_path / "m", threads=1)
    sp = tiny_vocab.tokenizer
    pairs = [(toy_sentences[i], toy_sentences[i + 1]) for i in range(0, 16, 2)]
    sources = ct2.source_pieces(tiny_vocab, [s for s, _ in pairs])
    targets = [sp.encode_as_pieces(t) for _, t in pairs]
    scored = translator.score_batch(sources, targets)                  # CTranslate2 appends </s>
    ours = teacher_forced_log_probs(ar_config, ar_params, [(sp.encode(src) + [EOS_ID], sp.encode(tgt) + [EOS_ID])
                                                           for src, tgt in pairs])
    for result, mine in zip(scored, ours):
        np.testing.assert_allclose(result.log_probs, mine, atol=1e-4)


def test_count_truncated_counts_what_prepare_cuts_as_narbench_does(ar_config, ar_params, tiny_vocab, tmp_path):
    spec = ct2.build_spec(ar_config, ar_params, ct2.vocabulary_pieces(tiny_vocab))
    spec.validate()
    spec.optimize(quantization=None)
    (tmp_path / "m").mkdir()
    spec.save(str(tmp_path / "m"))
    decoder = ct2.CT2Decoder(tmp_path / "m", tiny_vocab, "greedy", buckets=(16,), threads=1)
    long = " ".join(["river stone"] * 20)
    sources = ["alpha beta", long]
    assert decoder.max_source_tokens == 16 and decoder.count_truncated(sources) == 1
    assert [len(p) for p in decoder.prepare(sources)] == [len(tiny_vocab.encode("alpha beta")) + 1, 16]
    ours = decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", buckets=(16,), max_decode_length=16)
    assert ours.count_truncated(sources) == decoder.count_truncated(sources)


def test_relative_bias_is_transposed_and_queries_keep_their_scale(ar_config, ar_params, tiny_vocab):
    spec = ct2.build_spec(ar_config, ar_params, ct2.vocabulary_pieces(tiny_vocab))
    table = np.asarray(ar_params["encoder"]["relpos_bias"]["rel_embedding"])          # [heads, buckets]
    bias = spec.encoder.layer[1].self_attention.relative_attention_bias
    np.testing.assert_array_equal(bias, table.T)                                       # [buckets, heads]
    assert isinstance(spec.encoder.layer[0].self_attention.queries_scale, str)         # CTranslate2's 1/sqrt(hd)
    assert float(spec.decoder.scale_outputs) == pytest.approx(ar_config.d_model ** -0.5)


def test_only_ar_models_with_their_vocabulary_export(padir_config, padir_params, ar_config, ar_params, tiny_vocab):
    with pytest.raises(UserError, match="only AR checkpoints"):
        ct2.build_spec(padir_config, padir_params, ct2.vocabulary_pieces(tiny_vocab))
    with pytest.raises(UserError, match=f"vocabulary has {ar_config.vocab_size + 1} pieces"):
        ct2.build_spec(ar_config, ar_params, ["a"] * (ar_config.vocab_size + 1))


def test_missing_extra_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)             # import now raises ImportError
    with pytest.raises(UserError, match=r'CTranslate2 is not installed; install the extra: pip install -e "\.\[ct2\]"'):
        ct2.require_ctranslate2()


@pytest.fixture(scope="module")
def trained_ar(tmp_path_factory, tiny_vocab, toy_sentences):
    """A tiny AR model trained to copy toy sentences (so greedy search has confident choices)."""
    sp = tiny_vocab.tokenizer
    ids = [sp.encode(s)[:15] + [EOS_ID] for s in toy_sentences]
    config = preset("tiny", vocab_size=sp.get_piece_size(), dropout_rate=0.0, max_target_length=32)
    cfg = TrainConfig(steps=150, batch_tokens=512, max_length=16, buckets=(16,), warmup_steps=10,
                      learning_rate=3e-3, optimizer="adam", checkpoint_every=150)
    path = train("toy", config, cfg, tmp_path_factory.mktemp("ct2") / "ar", progress=False,
                 data=TokenPairs.from_lists(ids, ids))
    return path


def ct2_root(checkpoint_dir, quantization):
    from narbench_core import paths

    return paths.subdir("ct2") / f"{checkpoint_dir.resolve().name}-{quantization}"


@pytest.mark.slow
def test_greedy_agrees_with_narbench_ar_greedy(trained_ar, tiny_vocab, toy_sentences, tmp_path, capsys):
    from bench.cli import main

    config, params, _ = checkpoint.load(trained_ar)
    opts = dict(buckets=(16, 32), max_decode_length=32)
    ours = decoders.make_decoder(config, params, tiny_vocab, "greedy", **opts)
    theirs = ct2.load_decoder(trained_ar, "greedy", vocab=tiny_vocab, name="ct2-greedy", threads=1, **opts)
    sources = toy_sentences[:100]
    a = [ours.finish(ours.run(p), p).hypotheses[0] for p in (ours.prepare([s]) for s in sources)]
    out = [theirs.finish(theirs.run(p), p) for p in (theirs.prepare([s]) for s in sources)]
    b = [o.hypotheses[0] for o in out]
    assert np.mean([x == y for x, y in zip(a, b)]) >= 0.98
    assert np.mean([x == y for x, y in zip(a, sources)]) > 0.25         # it learned to copy: a real check
    assert all(1 <= o.passes[0] <= 32 for o in out) and theirs.xla_costs is False
    with pytest.raises(UserError, match="no XLA program"):
        theirs.lower(theirs.prepare(["a"]), "pass")
    # served in batches with CTranslate2's own batching (bench.serving): the batch's outputs are the one-by-one ones
    batched = ct2.load_decoder(trained_ar, "greedy", vocab=tiny_vocab, threads=1, max_batch_size=3,
                               batch_type="tokens", **opts)
    prepared = batched.prepare(sources[:8])
    assert batched.finish(batched.run(prepared), prepared).hypotheses == b[:8]
    with pytest.raises(UserError, match="batch_type must be examples or tokens"):
        ct2.load_decoder(trained_ar, "greedy", vocab=tiny_vocab, batch_type="sentences", **opts)
    # two workers (the distillation's teacher): batches run side by side, finished in any order, give the same
    two = ct2.load_decoder(trained_ar, "greedy", vocab=tiny_vocab, threads=1, parallel_batches=2, **opts)
    batches = [two.prepare(sources[i:i + 4]) for i in range(0, 12, 4)]
    runs = [two.run(p) for p in batches]
    finished = {i: two.finish(runs[i], batches[i]) for i in (2, 0, 1)}
    assert [h for i in range(3) for h in finished[i].hypotheses] == b[:12]
    assert [n for i in range(3) for n in finished[i].passes] == [o.passes[0] for o in out[:12]]
    with pytest.raises(UserError, match="parallel_batches must be at least 1"):
        ct2.load_decoder(trained_ar, "greedy", vocab=tiny_vocab, parallel_batches=0, **opts)
    # int8 weights: a model of their own, still translating
    int8 = ct2.load_decoder(trained_ar, "greedy", quantization="int8", vocab=tiny_vocab, threads=1, **opts)
    hyps = [int8.finish(int8.run(p), p).hypotheses[0] for p in (int8.prepare([s]) for s in sources[:20])]
    assert np.mean([x == y for x, y in zip(hyps, a[:20])]) > 0.2       # the same model, coarser weights
    sizes = {q: (ct2_root(trained_ar, q) / "model.bin").stat().st_size for q in ("float32", "int8")}
    assert sizes["int8"] < 0.5 * sizes["float32"]
    # the export command: a folder with the model and its stamp; a second export of it is kept
    out_dir = tmp_path / "exported"
    assert ct2.export(trained_ar, out_dir, vocab=tiny_vocab) == out_dir
    assert (out_dir / "model.bin").is_file() and (out_dir / "narbench.json").is_file()
    stamp = (out_dir / "model.bin").stat().st_mtime_ns
    ct2.export(trained_ar, out_dir, vocab=tiny_vocab)
    assert (out_dir / "model.bin").stat().st_mtime_ns == stamp
    with pytest.raises(UserError, match="holds another export .* pass --force"):
        ct2.export(trained_ar, out_dir, "int8", vocab=tiny_vocab)
    code = main(["export", "ct2", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")])
    assert code == 2 and "narbench: error:" in capsys.readouterr().err


def test_side_by_side_loads_export_one_at_a_time(monkeypatch, tmp_path):
    """Timing workers load CTranslate2 systems of one checkpoint side by side (threads = 1 and 2): the
    export runs under a file lock, so no load reads a folder another is replacing."""
    import threading
    import time

    from models import checkpoint, ct2
    from models import decoders as model_decoders

    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path))
    inside, most = [0], [0]

    def export(checkpoint_dir, out, quantization, force=False, vocab=None, cached=False):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        inside[0] -= 1

    monkeypatch.setattr(ct2, "export", export)
    monkeypatch.setattr(ct2, "CT2Decoder", lambda *args, **kwargs: "decoder")
    monkeypatch.setattr(checkpoint, "read_meta", lambda path: {"model_config": {}})
    monkeypatch.setattr(model_decoders, "checkpoint_vocabulary", lambda meta: None)
    loads = [threading.Thread(target=ct2.load_decoder, args=(tmp_path / "ckpt-ar", "greedy")) for _ in range(4)]
    for t in loads:
        t.start()
    for t in loads:
        t.join()
    assert most[0] == 1


def test_the_export_folder_honours_the_umask(ar_config, ar_params, tiny_vocab, tmp_path):
    """Like every folder narbench writes (teammates on a shared machine read it), not mkdtemp's 0700."""
    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, 1, ar_params, {"count": np.zeros((), np.int32)})
    checkpoint.write_meta(ckpt, {"task": "toy", "model_config": ar_config.to_dict(), "steps_done": 1,
                                 "complete": True})
    old = os.umask(0o027)
    try:
        out = ct2.export(ckpt, tmp_path / "exported", vocab=tiny_vocab)
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o750
    assert (out / "model.bin").stat().st_mode & 0o777 == 0o640


@pytest.fixture
def exportable(ar_config, ar_params, tiny_vocab, tmp_path):
    """A finished AR checkpoint (random weights) that names its vocabulary, as `narbench export` reads it."""
    import optax

    path = tmp_path / "ckpt-ar"
    checkpoint.save(path, 1, ar_params, optax.adam(1e-3).init(ar_params))
    checkpoint.write_meta(path, {"task": "toy", "kind": "ar", "model_config": ar_config.to_dict(), "complete": True,
                                 "steps_done": 1, "vocab_path": tiny_vocab.sentencepiece_model_file})
    return path


def test_force_replaces_only_folders_narbench_wrote(exportable, tmp_path, capsys):
    """--force refuses a folder of the user's own files (or a file) in one line and leaves it whole; it
    replaces a stamped export, an empty folder and an export written before the stamp existed."""
    from bench.cli import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    code = main(["export", "ct2", "--checkpoint", str(exportable), "--out", str(mine), "--force"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"narbench: error: {mine} was not written by narbench (no .narbench stamp); "
                                 "remove it yourself or pick another --out"]
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "years of work"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep")
    assert main(["export", "ct2", "--checkpoint", str(exportable), "--out", str(a_file), "--force"]) == 2
    assert f"{a_file} is a file, not a folder narbench wrote" in capsys.readouterr().err and a_file.read_text() == "keep"
    with pytest.raises(UserError, match="not written by narbench"):        # a checkpoint is not an export either
        ct2.export(exportable, exportable, force=True)
    assert checkpoint.read_meta(exportable)["kind"] == "ar"

    out = tmp_path / "model"
    out.mkdir()                                                            # empty: nothing to lose
    assert ct2.export(exportable, out, force=True) == out
    assert json.loads((out / ".narbench").read_text()) == {"written_by": "narbench export ct2"}
    ct2.export(exportable, out, "int8", force=True)                        # stamped: replaced
    assert json.loads((out / "narbench.json").read_text())["quantization"] == "int8"
    (out / ".narbench").unlink()                                           # an export from before the stamp
    ct2.export(exportable, out, "float32", force=True)
    assert json.loads((out / "narbench.json").read_text())["quantization"] == "float32"
    assert (out / ".narbench").is_file()


def test_an_export_is_of_the_checkpoints_weights_and_whole_or_written_again(exportable, ar_config, ar_params,
                                                                            tiny_vocab, tmp_path, capsys, monkeypatch):
    """`export ct2 --checkpoint B --out X --force` where X held A's export kept A's model.bin when A and B shared a
    folder name and steps; a truncated model.bin was kept too (issue 53). Exports now record the checkpoint's
    parameter digest and their own files' digests."""
    import jax
    import optax

    from bench.cli import main

    other = tmp_path / "elsewhere" / exportable.name                   # same folder name and steps, other weights
    params = jax.tree_util.tree_map(lambda x: x * 0.5, ar_params)
    checkpoint.save(other, 1, params, optax.adam(1e-3).init(params))
    checkpoint.write_meta(other, checkpoint.read_meta(exportable))
    assert checkpoint.params_digest(other) != checkpoint.params_digest(exportable)
    out = tmp_path / "X"
    assert main(["export", "ct2", "--checkpoint", str(exportable), "--out", str(out)]) == 0
    first = (out / "model.bin").read_bytes()
    code = main(["export", "ct2", "--checkpoint", str(other), "--out", str(out)])
    assert code == 2 and "holds another export" in capsys.readouterr().err        # not the same weights: refused
    assert main(["export", "ct2", "--checkpoint", str(other), "--out", str(out), "--force"]) == 0
    assert (out / "model.bin").read_bytes() != first
    assert json.loads((out / "narbench.json").read_text())["params_digest"] == checkpoint.params_digest(other)

    data = (out / "model.bin").read_bytes()
    (out / "model.bin").write_bytes(data[: len(data) // 2])                         # truncated
    with pytest.raises(UserError, match=r"^the CTranslate2 export .* does not load: model.bin has [\d,]+ bytes, not "):
        ct2.CT2Decoder(out, tiny_vocab, "greedy", threads=1)
    assert main(["export", "ct2", "--checkpoint", str(other), "--out", str(out), "--force"]) == 0
    assert (out / "model.bin").read_bytes() == data                                 # --force: written again

    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "data"))                     # the runner's cache folder
    ct2.load_decoder(exportable, "greedy", vocab=tiny_vocab, threads=1)
    cached = ct2_root(exportable, "float32") / "model.bin"
    cached.write_bytes(cached.read_bytes()[:100])
    assert ct2.load_decoder(exportable, "greedy", vocab=tiny_vocab, threads=1) is not None   # re-exported by itself
    assert cached.stat().st_size == len(data)                                       # same architecture, whole
