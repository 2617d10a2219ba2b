"""PaDIR as two ONNX graphs, built straight from the Flax parameters with the ``onnx`` package (no tracer,
no torch): the way ``models/ct2.py`` lays an AR checkpoint out for CTranslate2.

- **encoder** ``ids [b, s] int64 -> length_logits [b, C], k_0, v_0, ... k_{L-1}, v_{L-1}``: the encoder,
  the length predictor's logits (as the model computes them: from the [LENGTH] query or the masked mean;
  offsets are laid out as lengths on the host), and every decoder layer's cross-attention keys
  ``[b, h, hd, s]`` and values ``[b, h, s, hd]``, projected once per sentence (CTranslate2 caches them so,
  and XLA hoists them out of narbench's JAX refinement loop).
- **refine** ``tokens [r, n], mask [r, n], ids [b, s], k_i, v_i -> new [r, n] int64, conf [r, n]``: one
  parallel decoder pass over r = b * k hypotheses (source-major: each source's k hypotheses attend to its
  keys as one group, as ``models.t5._cross_attention`` does), followed by the argmax rule of
  ``models.refine.iterative_refinement`` (pad, unk and ``<mask>`` never emitted; with ``fixed_eos`` EOS
  placed at each row's last position and emitted nowhere else; pad outside the mask) and the log-prob of
  each chosen token. The [r, n, V] logits never leave the runtime.

What depends on positions alone is computed here once, in float32: the relative-position biases of both
stacks ``[1, h, N, N]`` and each positional-attention sublayer's query-key logits (absolute positions as
query and key), sliced to the call's length in the graph. Attention scales are folded into the query
kernels and the output scale 1/sqrt(d_model) into the output embedding; RMSNorm is written as
Pow-ReduceMean-Add-Sqrt-Div-Mul, the pattern ONNX Runtime fuses into one kernel.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from narbench_core.errors import UserError
from narbench_core.tokens import EOS_ID, MASK_ID, PAD_ID, UNK_ID

OPSET = 17
NEG_INF = -1e10                      # models.layers.NEG_INF: masked attention logits
EPSILON = 1e-6                       # models.layers.RMSNorm's
SUPPORTED = {"kind": ("padir",), "dtype": ("float32", "bfloat16")}   # what build() lays out (bfloat16: as float32)


def _onnx():
    try:
        import onnx
    except ImportError:
        raise UserError('the onnx package is not installed; install the extra: pip install -e ".[ort]"') from None
    return onnx


class GraphBuilder:
    """Nodes, constants and names of one ONNX graph (every op's output is a fresh name)."""

    def __init__(self, name: str):
        self.name, self.nodes, self.initializers, self.inputs, self.outputs = name, [], [], [], []
        self._count = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value: Any, hint: str = "c", dtype=np.float32) -> str:
        onnx = _onnx()
        name = self._fresh(hint)
        self.initializers.append(onnx.numpy_helper.from_array(np.ascontiguousarray(np.asarray(value, dtype)), name))
        return name

    def ints(self, values, hint: str = "i") -> str:
        return self.const(np.asarray(values, np.int64), hint, np.int64)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any):
        onnx = _onnx()
        names = [self._fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(onnx.helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def input(self, name: str, elem: int, shape: list) -> str:
        self.inputs.append(_onnx().helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, value: str, name: str, elem: int, shape: list) -> None:
        self.nodes.append(_onnx().helper.make_node("Identity", [value], [name]))
        self.outputs.append(_onnx().helper.make_tensor_value_info(name, elem, shape))

    def model(self):
        onnx = _onnx()
        graph = onnx.helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
                                       producer_name="narbench")
        model.ir_version = min(model.ir_version, 10)        # what ONNX Runtime 1.2x-1.3x reads
        return model

    # -- the layers ------------------------------------------------------------------------------
    def dim(self, x: str, axis: int) -> str:
        """[1] int64: ``x``'s size along ``axis``."""
        return self.op("Shape", x, start=axis, end=axis + 1)

    def rms_norm(self, x: str, scale: Any) -> str:
        mean = self.op("ReduceMean", self.op("Pow", x, self.const(2.0, "two")), axes=[-1], keepdims=1)
        root = self.op("Sqrt", self.op("Add", mean, self.const(EPSILON, "eps")))
        return self.op("Mul", self.op("Div", x, root), self.const(scale, "scale"))

    def dense(self, x: str, kernel: Any) -> str:
        return self.op("MatMul", x, self.const(kernel, "w"))

    def heads(self, x: str, h: int, hd: int, perm=(0, 2, 1, 3)) -> str:
        """[B, N, h*hd] -> [B, h, N, hd] (perm (0, 2, 3, 1): [B, h, hd, N], a key ready for the matmul)."""
        return self.op("Transpose", self.op("Reshape", x, self.ints([0, 0, h, hd])), perm=list(perm))

    def attend(self, q: str, k_t: str, v: str, mask: str, bias: str | None, d_out: int, out_kernel: Any) -> str:
        """softmax(q k^T + bias, masked) v, merged and projected: q [B, h, Nq, hd], k_t [B, h, hd, Nk],
        v [B, h, Nk, hd], mask bool broadcasting to [B, h, Nq, Nk] -> [B, Nq, d_out]."""
        logits = self.op("MatMul", q, k_t)                                            # [B, h, Nq, Nk]
        return self.attend_logits(logits, v, mask, bias, d_out, out_kernel)

    def self_attention(self, x: str, att: dict, h: int, hd: int, mask: str, bias: str | None) -> str:
        """Self-attention of the normed ``x`` [B, N, d]: one fused query-key-value matmul (the query kernel
        scaled by 1/sqrt(head_dim)), then ``attend``."""
        qkv = self.dense(x, np.concatenate([_flat_in(att["query"]["kernel"]) / np.sqrt(hd),
                                            _flat_in(att["key"]["kernel"]), _flat_in(att["value"]["kernel"])], axis=1))
        q, k, v = self.op("Split", qkv, self.ints([h * hd] * 3), axis=-1, outputs=3)
        return self.attend(self.heads(q, h, hd), self.heads(k, h, hd, (0, 2, 3, 1)), self.heads(v, h, hd), mask, bias,
                           h * hd, _flat_out(att["out"]["kernel"]))

    def attend_logits(self, logits: str, v: str, mask: str, bias: str | None, d_out: int, out_kernel: Any) -> str:
        if bias is not None:
            logits = self.op("Add", logits, bias)
        weights = self.op("Softmax", self.op("Where", mask, logits, self.const(NEG_INF, "neg")), axis=-1)
        out = self.op("Transpose", self.op("MatMul", weights, v), perm=[0, 2, 1, 3])  # [B, Nq, h, hd]
        return self.dense(self.op("Reshape", out, self.ints([0, 0, d_out])), out_kernel)

    def mlp(self, x: str, mlp: dict) -> str:
        """Gated GELU (tanh approximation, as ``flax.linen.gelu(approximate=True)``)."""
        gate = self.dense(x, _a(mlp["wi_0"]["kernel"]))
        cube = self.op("Mul", self.op("Mul", gate, gate), gate)
        inner = self.op("Mul", self.op("Add", gate, self.op("Mul", cube, self.const(0.044715))),
                        self.const(np.sqrt(2.0 / np.pi)))
        gelu = self.op("Mul", self.op("Mul", gate, self.const(0.5)),
                       self.op("Add", self.op("Tanh", inner), self.const(1.0)))
        return self.dense(self.op("Mul", gelu, self.dense(x, _a(mlp["wi_1"]["kernel"]))), _a(mlp["wo"]["kernel"]))

    def bias_slice(self, table: str, n: str) -> str:
        """table [1, h, N, N] -> [1, h, n, n] (n: [1] int64)."""
        both = self.op("Concat", n, n, axis=0)
        return self.op("Slice", table, self.ints([0, 0]), both, self.ints([2, 3]))


def _a(x: Any) -> np.ndarray:
    return np.asarray(x, np.float32)


def _flat_in(kernel: Any) -> np.ndarray:
    """A Flax DenseGeneral kernel [d, h, hd] -> [d, h*hd]."""
    k = _a(kernel)
    return k.reshape(k.shape[0], -1)


def _flat_out(kernel: Any) -> np.ndarray:
    """An attention output kernel [h, hd, d] -> [h*hd, d]."""
    k = _a(kernel)
    return k.reshape(-1, k.shape[-1])


def position_bias(table: Any, length: int, bidirectional: bool, max_distance: int) -> np.ndarray:
    """A stack's relative-position biases for every pair of ``length`` positions: [1, h, N, N], computed
    with the model's own bucketing (``models.layers.relative_position_bucket``)."""
    import jax.numpy as jnp

    from models.layers import relative_position_bucket

    table = _a(table)                                                                  # [h, buckets]
    pos = np.arange(length)
    buckets = np.asarray(relative_position_bucket(jnp.asarray(pos[None, :] - pos[:, None]), bidirectional,
                                                  table.shape[1], max_distance))       # [N, N]
    return table[:, buckets][None]


def check_exportable(config) -> None:
    """A one-line ``UserError`` for a model ``build_graphs`` cannot lay out."""
    for field, allowed in SUPPORTED.items():
        if getattr(config, field) not in allowed:
            raise UserError(f"only PaDIR checkpoints export to ONNX; this one has {field} = "
                            f"{getattr(config, field)!r} (AR models run in CTranslate2: `narbench export ct2`)")


def build_encoder(config, params: dict, max_source_tokens: int):
    """The encoder graph (see the module docstring) for sources of at most ``max_source_tokens`` ids."""
    onnx = _onnx()
    check_exportable(config)
    h, hd, d = config.num_heads, config.head_dim, config.d_model
    g = GraphBuilder("padir_encoder")
    ids = g.input("ids", onnx.TensorProto.INT64, ["batch", "source"])
    enc = params["encoder"]
    x = g.op("Gather", g.const(_a(params["token_embedder"]["embedding"]), "embedding"), ids)   # [b, s, d]
    real = g.op("Greater", ids, g.ints(0))                                                     # [b, s] bool
    batch = g.dim(ids, 0)
    if config.length_token:                   # the [LENGTH] query reads with the source, position 0
        first = g.op("Expand", g.const(_a(params["length_query"]).reshape(1, 1, d), "length_query"),
                     g.op("Concat", batch, g.ints([1, d]), axis=0))
        x = g.op("Concat", first, x, axis=1)
        yes = g.op("Expand", g.const(np.ones((1, 1), bool), "yes", bool), g.op("Concat", batch, g.ints([1]), axis=0))
        real = g.op("Concat", yes, real, axis=1)
    positions = max_source_tokens + int(bool(config.length_token))
    bias = g.bias_slice(g.const(position_bias(enc["relpos_bias"]["rel_embedding"], positions, True,
                                              config.relative_attention_max_distance), "enc_bias"), g.dim(x, 1))
    mask = g.op("Unsqueeze", real, g.ints([1, 2]))                                            # [b, 1, 1, s]
    for i in range(config.num_encoder_layers):
        layer = enc[f"layers_{i}"]
        x = g.op("Add", x, g.self_attention(g.rms_norm(x, layer["pre_attention_layer_norm"]["scale"]),
                                            layer["attention"], h, hd, mask, bias))
        x = g.op("Add", x, g.mlp(g.rms_norm(x, layer["pre_mlp_layer_norm"]["scale"]), layer["mlp"]))
    x = g.rms_norm(x, enc["encoder_norm"]["scale"])                                           # [b, (1+)s, d]
    predictor = params["length_predictor"]
    if config.length_token:
        pooled = g.op("Squeeze", g.op("Gather", x, g.ints([0]), axis=1), g.ints([1]))          # [b, d]
        source = g.op("Slice", x, g.ints([1]), g.ints([np.iinfo(np.int64).max]), g.ints([1]))
    else:
        weight = g.op("Unsqueeze", g.op("Cast", real, to=onnx.TensorProto.FLOAT), g.ints([2]))  # [b, s, 1]
        total = g.op("ReduceSum", g.op("Mul", x, weight), g.ints([1]), keepdims=0)            # [b, d]
        count = g.op("Max", g.op("ReduceSum", weight, g.ints([1]), keepdims=0), g.const(1.0))
        pooled, source = g.op("Div", total, count), x
    classes = int(np.shape(predictor["kernel"])[1])
    g.output(g.op("Add", g.dense(pooled, _a(predictor["kernel"])), g.const(_a(predictor["bias"]), "length_bias")),
             "length_logits", onnx.TensorProto.FLOAT, ["batch", classes])
    for i in range(config.num_decoder_layers):
        cross = params["decoder"][f"layers_{i}"]["encoder_decoder_attention"]
        g.output(g.heads(g.dense(source, _flat_in(cross["key"]["kernel"])), h, hd, (0, 2, 3, 1)),
                 f"k_{i}", onnx.TensorProto.FLOAT, ["batch", h, hd, "source"])
        g.output(g.heads(g.dense(source, _flat_in(cross["value"]["kernel"])), h, hd),
                 f"v_{i}", onnx.TensorProto.FLOAT, ["batch", h, "source", hd])
    return g.model()


def banned_ids(vocab_size: int, fixed_eos: bool) -> np.ndarray:
    """[V] float32: -inf at the ids the argmax never picks (pad, unk, ``<mask>``; EOS with ``fixed_eos``)."""
    ban = np.zeros(vocab_size, np.float32)
    ban[[PAD_ID, UNK_ID, MASK_ID] + ([EOS_ID] if fixed_eos else [])] = -np.inf
    return ban


def build_refine(config, params: dict):
    """The refinement-pass graph (see the module docstring)."""
    import jax.numpy as jnp

    onnx = _onnx()
    check_exportable(config)
    h, hd, d, m = config.num_heads, config.head_dim, config.d_model, config.max_target_length
    dec = params["decoder"]
    g = GraphBuilder("padir_refine")
    tokens = g.input("tokens", onnx.TensorProto.INT64, ["rows", "length"])
    token_mask = g.input("mask", onnx.TensorProto.INT64, ["rows", "length"])
    ids = g.input("ids", onnx.TensorProto.INT64, ["batch", "source"])
    keys = [(g.input(f"k_{i}", onnx.TensorProto.FLOAT, ["batch", h, hd, "source"]),
             g.input(f"v_{i}", onnx.TensorProto.FLOAT, ["batch", h, "source", hd]))
            for i in range(config.num_decoder_layers)]
    n, rows, batch = g.dim(tokens, 1), g.dim(tokens, 0), g.dim(ids, 0)
    embedding = _a(params["token_embedder"]["embedding"])                               # [V, d]
    pos_table = _a(dec["position_embedder"]["embedding"])                               # [M, d]
    positions = g.op("Slice", g.const(pos_table, "positions"), g.ints([0]), n, g.ints([0]))   # [n, d]
    x = g.op("Add", g.op("Gather", g.const(embedding, "embedding"), tokens), positions)      # [r, n, d]
    valid = g.op("Greater", token_mask, g.ints(0))                                            # [r, n] bool
    self_mask = g.op("Unsqueeze", valid, g.ints([1, 2]))                                     # [r, 1, 1, n]
    cross_mask = g.op("Unsqueeze", g.op("Greater", ids, g.ints(0)), g.ints([1, 2]))         # [b, 1, 1, s]
    bias = g.bias_slice(g.const(position_bias(dec["relpos_bias"]["rel_embedding"], m, True,
                                              config.relative_attention_max_distance), "dec_bias"), n)
    grouped = g.op("Concat", batch, g.ints([-1, h * hd]), axis=0)       # [b, k*n, h*hd]: a source's hypotheses
    ungrouped = g.op("Concat", rows, n, g.ints([h * hd]), axis=0)       # back to [r, n, h*hd]
    scale = 1.0 / np.sqrt(hd)
    for i in range(config.num_decoder_layers):
        layer = dec[f"layers_{i}"]
        x = g.op("Add", x, g.self_attention(g.rms_norm(x, layer["pre_self_attention_layer_norm"]["scale"]),
                                            layer["self_attention"], h, hd, self_mask, bias))
        if config.positional_attention:      # positions as query and key (logits fixed per length), states as values
            pos = layer["positional_attention"]
            pq = jnp.einsum("nd,dhk->hnk", pos_table, _a(pos["query"]["kernel"])) * scale
            pk = jnp.einsum("nd,dhk->hnk", pos_table, _a(pos["key"]["kernel"]))
            logits = g.bias_slice(g.const(np.asarray(jnp.einsum("hqk,hnk->hqn", pq, pk))[None], "pos_logits"), n)
            y = g.rms_norm(x, layer["pre_positional_attention_layer_norm"]["scale"])
            value = g.heads(g.dense(y, _flat_in(pos["value"]["kernel"])), h, hd)
            x = g.op("Add", x, g.attend_logits(logits, value, self_mask, None, h * hd, _flat_out(pos["out"]["kernel"])))
        cross = layer["encoder_decoder_attention"]
        y = g.rms_norm(x, layer["pre_cross_attention_layer_norm"]["scale"])
        q = g.op("Reshape", g.dense(y, _flat_in(cross["query"]["kernel"]) * scale), grouped)   # [b, k*n, h*hd]
        out = g.attend(g.heads(q, h, hd), keys[i][0], keys[i][1], cross_mask, None, h * hd,
                       _flat_out(cross["out"]["kernel"]))                                # [b, k*n, d]
        x = g.op("Add", x, g.op("Reshape", out, ungrouped))
        x = g.op("Add", x, g.mlp(g.rms_norm(x, layer["pre_mlp_layer_norm"]["scale"]), layer["mlp"]))
    x = g.rms_norm(x, dec["decoder_norm"]["scale"])
    logits = g.dense(x, embedding.T / np.sqrt(np.float32(d)))                                 # [r, n, V]
    # TopK(1), not ArgMax: the same index (ties to the lower id) in half ArgMax's time in ONNX Runtime 1.31
    # (0.81 against 1.71 ms over [200, 1, 8000] logits on one thread)
    _, best = g.op("TopK", g.op("Add", logits, g.const(banned_ids(config.vocab_size, config.fixed_eos), "ban")),
                   g.ints([1]), axis=-1, outputs=2)
    best = g.op("Squeeze", best, g.ints([-1]))                                                # [r, n] int64
    if config.fixed_eos:                     # EOS at each row's last position inside the mask
        last = g.op("Sub", g.op("ReduceSum", token_mask, g.ints([1]), keepdims=1), g.ints(1))   # [r, 1]
        index = g.op("Slice", g.ints(np.arange(m)), g.ints([0]), n, g.ints([0]))              # [n]
        here = g.op("And", g.op("Equal", g.op("Unsqueeze", index, g.ints([0])), last), valid)
        best = g.op("Where", here, g.ints(EOS_ID), best)
    new = g.op("Where", valid, best, g.ints(PAD_ID))
    logp = g.op("LogSoftmax", logits, axis=-1)
    conf = g.op("Squeeze", g.op("GatherElements", logp, g.op("Unsqueeze", new, g.ints([-1])), axis=-1), g.ints([-1]))
    g.output(new, "new", onnx.TensorProto.INT64, ["rows", "length"])
    g.output(conf, "conf", onnx.TensorProto.FLOAT, ["rows", "length"])
    return g.model()
