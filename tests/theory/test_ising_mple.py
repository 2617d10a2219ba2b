"""k-pseudolikelihood on Ising models: exact enumeration, k = N is the likelihood, gradients,
convergence, and 'masking more is better' on a small seeded run."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theory import ising

N = 4


def _single_sample_weights(x: int, k: int) -> np.ndarray:
    """All masks of size k on one state x (the 'all' estimator for a one-sample data set)."""
    m = ising.subset_masks(N, k)
    w = np.zeros((len(m), 2**N), np.float32)
    w[:, x] = 1.0 / len(m)
    return w


def test_enumeration_sums_to_one_and_matches_energies():
    feats = jnp.asarray(ising.features(N))
    theta = jnp.asarray(ising.theta_of(N, 0.3, 0.1))
    logp = ising.log_probs(theta, feats)
    assert float(jnp.exp(logp).sum()) == pytest.approx(1.0, abs=1e-6)
    x = ising.all_states(N)
    energy = 0.1 * x.sum(1) + 0.3 * (x.sum(1) ** 2 - N)          # sum_{i != j} J x_i x_j = J((sum x)^2 - N)
    expected = energy - np.log(np.exp(energy).sum())
    np.testing.assert_allclose(np.asarray(logp), expected, atol=1e-5)


def test_k_equals_n_pseudolikelihood_is_the_likelihood():
    feats = jnp.asarray(ising.features(N))
    theta = jnp.asarray(np.random.default_rng(0).normal(size=ising.num_params(N)).astype(np.float32))
    cons = jnp.asarray(ising.consistency(N, ising.subset_masks(N, N)))
    logp = ising.log_probs(theta, feats)
    for x in (0, 5, 15):
        loss = ising.pl_loss(theta, jnp.asarray(_single_sample_weights(x, N)), cons, feats)
        assert float(loss) == pytest.approx(-float(logp[x]), abs=1e-5)


def test_k1_is_the_classic_pseudolikelihood():
    """k = 1: the mean over i of -log p(x_i | x_-i), computed here from the joint directly."""
    feats = jnp.asarray(ising.features(N))
    theta = jnp.asarray(ising.theta_of(N, 0.2, -0.1))
    p = np.exp(np.asarray(ising.log_probs(theta, feats)))
    x = 6
    expected = np.mean([-np.log(p[x] / (p[x] + p[x ^ (1 << i)])) for i in range(N)])
    cons = jnp.asarray(ising.consistency(N, ising.subset_masks(N, 1)))
    loss = ising.pl_loss(theta, jnp.asarray(_single_sample_weights(x, 1)), cons, feats)
    assert float(loss) == pytest.approx(expected, abs=1e-5)


def test_gradient_matches_finite_differences():
    with jax.enable_x64(True):
        feats = jnp.asarray(ising.features(N).astype(np.float64))
        rng = np.random.default_rng(1)
        theta = rng.normal(scale=0.5, size=ising.num_params(N))
        m = ising.subset_masks(N, 2)
        w = rng.random((len(m), 2**N))
        w = jnp.asarray(w / w.sum())
        cons = jnp.asarray(ising.consistency(N, m))
        f = lambda t: float(ising.pl_loss(jnp.asarray(t), w, cons, feats))
        grad = np.asarray(jax.grad(ising.pl_loss)(jnp.asarray(theta), w, cons, feats))
        eps = 1e-6
        fd = np.array([(f(theta + eps * e) - f(theta - eps * e)) / (2 * eps) for e in np.eye(len(theta))])
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_fit_recovers_population_optimum_with_certificate():
    """On population weights (exact p(x)), the minimiser is theta*; GD reaches the tolerance."""
    feats = ising.features(N)
    theta_star = ising.theta_of(N, 0.3)
    p = np.exp(np.asarray(ising.log_probs(jnp.asarray(theta_star), jnp.asarray(feats))))
    W, C = [], []
    for k in (1, 4):
        m = ising.subset_masks(N, k)
        w = np.zeros((6, 2**N))
        w[: len(m)] = p[None] / len(m)
        pad = np.concatenate([m, np.full(6 - len(m), 2**N - 1)])
        W.append(w)
        C.append(ising.consistency(N, pad))
    res = ising.fit(np.stack(W), np.stack(C), feats, tol=1e-7, max_steps=3000)
    assert res.converged.all(), res.grad_norm
    np.testing.assert_allclose(res.theta, np.stack([theta_star] * 2), atol=1e-4)


def test_asymptotic_variance_decreases_with_k():
    """Theorem 1: Tr(Gamma_{k+1}) <= Tr(Gamma_k)."""
    traces = [ising.asymptotic_trace(N, ising.theta_of(N, 0.3), k) for k in range(1, N + 1)]
    assert all(a >= b - 1e-9 for a, b in zip(traces, traces[1:])), traces
    assert traces[0] > 1.5 * traces[-1]


def test_larger_k_lower_error_on_a_small_seeded_run():
    cfg = ising.IsingConfig(couplings=(0.3,), sizes=(2000,), reps=8, seed=3)
    rows = ising.run_ising(cfg, progress=lambda *_: None)
    err = {r["k"]: r["sq_error_mean"] for r in rows}
    assert sorted(err) == [1, 2, 3, 4]
    assert err[1] > err[2] > err[4], err
    assert err[1] > 1.5 * err[4], err
    assert all(r["converged"] == r["reps"] for r in rows)
    table = ising.markdown_table(rows)
    assert "J = 0.3" in table and "k = 4" in table


def test_bad_config_is_a_user_error():
    from narbench_core.errors import UserError

    with pytest.raises(UserError):
        ising.IsingConfig(n=20).validate()
    with pytest.raises(UserError):
        ising.IsingConfig(ks=(5,)).validate()
