"""The train step's arithmetic in its fast forms: the cross-entropy and the dense layers' 2-D matmuls agree with the
plain forms they replace (values and gradients)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.layers import flat_dot_general
from models.losses import token_cross_entropy

B, L, V = 3, 5, 11


def _reference(logits, targets, weights, ls):
    """The textbook forms: log-softmax, a gather of the target's log-probability, argmax hits."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    loss = (1.0 - ls) * nll - ls * logp.mean(axis=-1)
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    w = weights.astype(jnp.float32)
    return {"loss_sum": (loss * w).sum(), "nll_sum": (nll * w).sum(), "correct_sum": (hits * w).sum(),
            "weight_sum": w.sum()}


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_cross_entropy_matches_the_textbook_form_and_its_gradient(ls):
    logits = jax.random.normal(jax.random.key(0), (B, L, V)) * 3.0
    targets = jax.random.randint(jax.random.key(1), (B, L), 0, V)
    targets = targets.at[0, 0].set(int(jnp.argmax(logits[0, 0])))      # at least one hit, so hits are compared
    weights = jnp.ones((B, L)).at[2, 3:].set(0.0)
    got, want = token_cross_entropy(logits, targets, weights, ls), _reference(logits, targets, weights, ls)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    assert float(got["correct_sum"]) >= 1
    grad = jax.grad(lambda x: token_cross_entropy(x, targets, weights, ls)["loss_sum"])(logits)
    grad_ref = jax.grad(lambda x: _reference(x, targets, weights, ls)["loss_sum"])(logits)
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-5, atol=1e-6)


def test_a_hit_is_the_target_at_the_row_maximum_and_a_tie_counts():
    logits = jnp.array([[[2.0, 2.0, 0.0], [0.0, 1.0, 3.0]]])             # row 0: classes 0 and 1 tie at the top
    got = token_cross_entropy(logits, jnp.array([[1, 1]]), jnp.ones((1, 2)))
    assert float(got["correct_sum"]) == 1.0                                 # row 0's tie counts, row 1 misses


@pytest.mark.parametrize("lhs_shape, rhs_shape, contract", [
    ((2, 3, 4), (4, 5), ((2,), (0,))),                 # Dense: [b, n, d] x [d, f]
    ((2, 3, 4), (4, 2, 3), ((2,), (0,))),              # DenseGeneral to heads: [b, n, d] x [d, h, hd]
    ((2, 3, 2, 3), (2, 3, 4), ((2, 3), (0, 1))),       # DenseGeneral from heads: [b, n, h, hd] x [h, hd, d]
])
def test_flat_dot_general_is_dot_general(lhs_shape, rhs_shape, contract):
    lhs = jax.random.normal(jax.random.key(2), lhs_shape)
    rhs = jax.random.normal(jax.random.key(3), rhs_shape)
    numbers = (contract, ((), ()))
    want = jax.lax.dot_general(lhs, rhs, numbers)
    np.testing.assert_allclose(flat_dot_general(lhs, rhs, numbers), want, rtol=1e-5, atol=1e-5)

    def loss(f):
        return lambda a, b: jnp.tanh(f(a, b, numbers)).sum()
    for got, ref in zip(jax.grad(loss(flat_dot_general), argnums=(0, 1))(lhs, rhs),
                        jax.grad(loss(jax.lax.dot_general), argnums=(0, 1))(lhs, rhs)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_flat_dot_general_leaves_other_contractions_to_dot_general():
    lhs = jax.random.normal(jax.random.key(4), (2, 3, 4))
    rhs = jax.random.normal(jax.random.key(5), (2, 4, 5))
    batched = (((2,), (1,)), ((0,), (0,)))                                  # a batch axis: not a dense layer's
    np.testing.assert_allclose(flat_dot_general(lhs, rhs, batched), jax.lax.dot_general(lhs, rhs, batched),
                               rtol=1e-5, atol=1e-5)
    leading = (((1,), (0,)), ((), ()))                                      # contracts a middle axis of lhs
    rhs2 = jax.random.normal(jax.random.key(6), (3, 5))
    np.testing.assert_allclose(flat_dot_general(lhs, rhs2, leading), jax.lax.dot_general(lhs, rhs2, leading),
                               rtol=1e-5, atol=1e-5)


def test_a_dense_layer_with_flat_dot_general_computes_what_the_plain_one_does():
    x = jax.random.normal(jax.random.key(7), (2, 3, 4))
    plain, flat = nn.DenseGeneral((2, 3), use_bias=False), nn.DenseGeneral((2, 3), use_bias=False,
                                                                           dot_general=flat_dot_general)
    params = plain.init(jax.random.key(8), x)
    np.testing.assert_allclose(flat.apply(params, x), plain.apply(params, x), rtol=1e-5, atol=1e-5)
