"""PaDIR on ONNX Runtime: float32 graphs reproduce JAX PaDIR exactly, int8 exports load and decode, the
export's stamp and --force rules, damaged exports, the one-line errors, and the host loop's numpy helpers."""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import checkpoint, decoders, ort, refine, t5
from models.config import preset
from narbench_core.errors import UserError

pytest.importorskip("onnxruntime", reason="the ort extra is part of the dev extras: pip install -e '.[dev]'")

SOURCES = ["the river and the stone", "alpha beta", "she was in the house of light and water",
           "gamma delta night", "a is was he she the of", "light light water water stone",
           "in the house", "beta"]
OPTS = dict(buckets=(8, 16), max_decode_length=16)
MODELS = {"plain": {}, "reference": dict(length_token=True, fixed_eos=True, length_offset=True),
          "no positional attention": dict(positional_attention=False)}
DECODINGS = {"k1 T4 stutter": ("refine:4", dict(length_hyps=1)),
             "k3 T5 mask-predict": ("refine:5", dict(length_hyps=3, remask="mask-predict")),
             "k2 T3 mask start": ("refine:3", dict(length_hyps=2, start="mask", seed=7)),
             "k1 T2 no remask, bonus": ("refine:2", dict(length_hyps=1, remask="none", length_bonus=2))}


def _graphs(tmp_path, config, params, quantization="float32", max_source_tokens=16):
    ort.write_graphs(tmp_path, config, params, quantization, max_source_tokens)
    (tmp_path / "narbench.json").write_text(json.dumps({"max_source_tokens": max_source_tokens}))
    return tmp_path


def _outputs(decoder, sources):
    prepared = decoder.prepare(sources)
    return decoder.finish(decoder.run(prepared), prepared)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_float32_graphs_reproduce_jax_padir(model, tiny_vocab, tmp_path):
    """Sentence by sentence and as one batch: the same hypotheses and passes as JAX PaDIR, for every
    decoding option (k, T, remask, start, seed, length bonus) and model variant (one shape bucket, so JAX
    compiles once per decoding)."""
    config = preset("tiny", kind="padir", vocab_size=64, dropout_rate=0.0, max_target_length=32, **MODELS[model])
    params = t5.init_params(config, jax.random.key(3))
    folder = _graphs(tmp_path, config, params)
    shapes = dict(buckets=(16,), max_decode_length=16)
    for spec, options in DECODINGS.values():
        ours = decoders.make_decoder(config, params, tiny_vocab, spec, **shapes, **options)
        ours.warmup_inputs(len(SOURCES))          # JAX pads a sentence to the batch's shape: one program per decoding
        theirs = ort.ORTPaDIRDecoder(folder, config, tiny_vocab, spec, threads=1, **shapes, **options)
        for sentence in SOURCES:
            a, b = _outputs(ours, [sentence]), _outputs(theirs, [sentence])
            assert a.hypotheses == b.hypotheses and a.passes.tolist() == b.passes.tolist(), (spec, sentence)
        a, b = _outputs(ours, SOURCES), _outputs(theirs, SOURCES)
        assert a.hypotheses == b.hypotheses and a.passes.tolist() == b.passes.tolist(), spec
    assert theirs.xla_costs is False
    with pytest.raises(UserError, match="no XLA program"):
        theirs.lower(theirs.prepare(["a"]), "pass")


def test_phases_cover_the_loop(padir_config, padir_params, tiny_vocab, tmp_path):
    """A timed call splits into encode, host and passes, which add up to the call."""
    import time

    from narbench_core import phases

    folder = _graphs(tmp_path, padir_config, padir_params)
    decoder = ort.ORTPaDIRDecoder(folder, padir_config, tiny_vocab, "refine:3", threads=1, length_hyps=2, **OPTS)
    prepared = decoder.prepare(SOURCES[:2])
    with phases.recording(time.perf_counter_ns) as rec:
        decoder.run(prepared)
    assert {phases.ENCODE, phases.HOST, phases.PASSES} <= set(rec.ms)
    assert sum(rec.ms.values()) == pytest.approx((rec.last - rec.start) / 1e6)


@pytest.fixture
def exportable(padir_config, padir_params, tiny_vocab, tmp_path):
    """A finished PaDIR checkpoint (random weights) that names its vocabulary, as `narbench export` reads it."""
    import optax

    path = tmp_path / "ckpt-padir"
    checkpoint.save(path, 1, padir_params, optax.adam(1e-3).init(padir_params))
    checkpoint.write_meta(path, {"task": "toy", "kind": "padir", "model_config": padir_config.to_dict(),
                                 "complete": True, "steps_done": 1, "vocab_path": tiny_vocab.sentencepiece_model_file})
    return path


def test_int8_export_loads_and_decodes(exportable, padir_config, padir_params, tiny_vocab, tmp_path, monkeypatch):
    """int8 quantizes the weight matrices (smaller graphs, integer matmuls) and still translates; the
    runner's load exports into the data root once and reuses it."""
    import onnx

    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "data"))
    int8 = ort.load_decoder(exportable, "refine:4", quantization="int8", threads=1, length_hyps=2, **OPTS)
    folder = ort.export_dir(exportable, "int8")
    ops = {node.op_type for name in ort.GRAPHS for node in onnx.load(str(folder / name)).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}, ops
    fp32 = ort.load_decoder(exportable, "refine:4", threads=1, length_hyps=2, **OPTS)
    size = lambda q: sum((ort.export_dir(exportable, q) / g).stat().st_size for g in ort.GRAPHS)   # noqa: E731
    assert size("int8") < 0.6 * size("float32")
    out = _outputs(int8, SOURCES)
    assert len(out.hypotheses) == len(SOURCES) and all(1 <= p <= 4 for p in out.passes)
    jax_out = _outputs(decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:4", length_hyps=2, **OPTS),
                       SOURCES)
    assert _outputs(fp32, SOURCES).hypotheses == jax_out.hypotheses
    written = (folder / "refine.onnx").stat().st_mtime_ns
    ort.load_decoder(exportable, "refine:1", quantization="int8", threads=1, **OPTS)
    assert (folder / "refine.onnx").stat().st_mtime_ns == written             # cached, not exported again


def test_a_damaged_export_is_named_and_the_runner_rewrites_it(exportable, tiny_vocab, tmp_path, monkeypatch):
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "data"))
    ort.load_decoder(exportable, "refine:2", threads=1, **OPTS)
    folder = ort.export_dir(exportable, "float32")
    whole = (folder / "refine.onnx").read_bytes()
    (folder / "refine.onnx").write_bytes(whole[: len(whole) // 3])             # truncated
    with pytest.raises(UserError, match=r"^the ONNX Runtime export .* does not load: refine.onnx has [\d,]+ bytes, "
                                        r"not the [\d,]+ written .*; re-export it with `narbench export onnx --force`"):
        ort.ORTPaDIRDecoder(folder, checkpoint.load(exportable)[0], tiny_vocab, "refine:2", threads=1, **OPTS)
    decoder = ort.load_decoder(exportable, "refine:2", threads=1, **OPTS)
    assert len(_outputs(decoder, SOURCES[:2]).hypotheses) == 2
    assert (folder / "refine.onnx").read_bytes() == whole


def test_export_stamp_and_force(exportable, tmp_path, capsys):
    """A second export of the same thing is kept; another quantization needs --force; --force rewrites
    narbench's own folders only and leaves anything else whole."""
    from bench.cli import main

    out = tmp_path / "exported"
    assert main(["export", "onnx", "--checkpoint", str(exportable), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".narbench", "encoder.onnx", "narbench.json", "refine.onnx"]
    written = (out / "refine.onnx").stat().st_mtime_ns
    ort.export(exportable, out)
    assert (out / "refine.onnx").stat().st_mtime_ns == written
    with pytest.raises(UserError, match="holds another export .*; pass --force"):
        ort.export(exportable, out, "int8")
    ort.export(exportable, out, force=True)
    assert (out / "refine.onnx").stat().st_mtime_ns != written                 # --force rewrites
    ort.export(exportable, out, "int8", force=True)
    assert json.loads((out / "narbench.json").read_text())["quantization"] == "int8"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    capsys.readouterr()
    code = main(["export", "onnx", "--checkpoint", str(exportable), "--out", str(mine), "--force"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"narbench: error: {mine} was not written by narbench (no .narbench stamp); "
                                 "remove it yourself or pick another --out"]
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]
    with pytest.raises(UserError, match="not written by narbench"):           # a checkpoint is not an export
        ort.export(exportable, exportable, force=True)


def test_what_cannot_export_is_one_line(ar_config, ar_params, exportable, tmp_path, monkeypatch, capsys):
    from bench.cli import main
    from models.onnx_graph import build_encoder

    with pytest.raises(UserError, match=r"only PaDIR checkpoints export to ONNX; this one has kind = 'ar'"):
        build_encoder(ar_config, ar_params, 16)
    assert main(["export", "onnx", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    assert "narbench: error:" in capsys.readouterr().err and not (tmp_path / "x").exists()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)                     # import now raises ImportError
    code = main(["export", "onnx", "--checkpoint", str(exportable), "--out", str(tmp_path / "y")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ['narbench: error: ONNX Runtime is not installed; install the extra: '
                                 'pip install -e ".[ort]"'] and not (tmp_path / "y").exists()


def test_host_helpers_match_the_jax_loop():
    """The numpy steps of the loop are ``models.refine``'s, on random inputs with ties and repeats."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        tokens = rng.integers(4, 8, (6, 10))                                   # few ids: many repeats
        valid = np.arange(10)[None, :] < rng.integers(1, 11, (6, 1))
        repl = rng.integers(4, 64, (6, 10))
        conf = np.round(rng.normal(size=(6, 10)), 1).astype(np.float32)      # ties
        np.testing.assert_array_equal(ort.drop_repeats(tokens, valid),
                                      refine.drop_repeats(jnp.asarray(tokens), jnp.asarray(valid)))
        np.testing.assert_array_equal(ort.remask_stutter(tokens, valid, repl),
                                      refine.remask_stutter(jnp.asarray(tokens), jnp.asarray(valid), jnp.asarray(repl)))
        done = rng.integers(1, 4, 6)
        np.testing.assert_array_equal(
            ort.mask_predict_remask(tokens, conf, valid, repl, done, 4),
            refine.mask_predict_remask(jnp.asarray(tokens), jnp.asarray(conf), jnp.asarray(valid), jnp.asarray(repl),
                                       jnp.asarray(done), 4))
        logits = np.round(rng.normal(size=(3, 33)), 1).astype(np.float32)
        np.testing.assert_array_equal(ort.top_k_lengths(logits, 4, 20), refine.top_k_lengths(jnp.asarray(logits), 4, 20))
        offsets = rng.normal(size=(3, 65)).astype(np.float32)
        lengths = rng.integers(1, 40, 3)
        np.testing.assert_array_equal(ort.offset_to_lengths(offsets, lengths, 32),
                                      t5.offset_to_length_logits(jnp.asarray(offsets), jnp.asarray(lengths), 32))
