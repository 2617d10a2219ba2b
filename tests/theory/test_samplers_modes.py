"""k-Gibbs vs the independent parallel sampler on Equation 5's model, started in R_-1."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from theory import samplers

N, C, H, BUDGET, SEEDS = 8, 4, 2.0, 200, 6


def _hits(J: float, ks: list[int], seed: int = 0) -> dict[int, np.ndarray]:
    grid = [(k, s) for k in ks for s in range(SEEDS)]
    keys = jax.random.split(jax.random.PRNGKey(seed), len(grid))
    t = samplers.hitting_times(N, C, np.full(len(grid), J, np.float32), np.array([g[0] for g in grid], np.int32),
                               samplers.fields(N, H), BUDGET, keys)
    return {k: t[[i for i, g in enumerate(grid) if g[0] == k]] for k in ks}


@pytest.fixture(scope="module")
def weak_and_strong():
    ks = [samplers.PARALLEL, 1, 2, 4, 5, 8]
    return _hits(0.0, ks), _hits(6.0, ks)


def test_energy_matches_equation_5():
    h = samplers.fields(N, H)
    e = samplers.energies(N, C, 1.5, h)
    x = samplers.spins(N)
    s = 37
    pair = sum(1.5 * x[s, i] * x[s, j] for i in range(C) for j in range(C) if i != j)
    assert e[s] == pytest.approx(float(x[s] @ h + pair), abs=1e-5)
    assert samplers.start_state(N, C, h) == sum(1 << i for i in range(C, N))    # clique -1, rest +1


def test_without_coupling_every_sampler_reaches_the_mode_quickly(weak_and_strong):
    weak, _ = weak_and_strong
    for k, t in weak.items():
        assert (t <= BUDGET).all(), (k, t)
    assert (weak[samplers.PARALLEL] <= 3).all()            # all clique spins flip to + in ~1 step
    assert np.mean(weak[1]) < 60                             # coupon collector over 8 sites


def test_strong_coupling_only_large_blocks_escape(weak_and_strong):
    _, strong = weak_and_strong
    assert (strong[samplers.PARALLEL] > BUDGET).all()
    assert (strong[1] > BUDGET).all() and (strong[2] > BUDGET).all()
    # k = 4 = |C_G| needs the one block of C(8, 4) = 70 that covers the clique: ~70 steps on average
    assert np.mean(strong[4] <= BUDGET) >= 0.5
    assert (strong[5] <= BUDGET).all() and (strong[8] <= BUDGET).all()   # ~14 and ~2.3 steps
    assert np.mean(strong[8]) < np.mean(strong[5]) < np.mean(strong[4])    # larger k is faster


def test_one_jump_estimate():
    h = samplers.fields(N, H)
    assert samplers.one_jump_steps(N, C, 2, 6.0, h) == float("inf")
    # k = N: the block always covers C_G and R_1 has all but ~exp(-4H) of the clique's mass
    assert samplers.one_jump_steps(N, C, N, 6.0, h) == pytest.approx(1.0, rel=1e-3)
    assert samplers.one_jump_steps(N, C, C, 6.0, h) == pytest.approx(70.0, rel=1e-3)   # C(8, 4)


def test_run_samplers_rows_and_table():
    cfg = samplers.SamplerConfig(n=6, clique=3, field=2.0, couplings=(0.0, 5.0), ks=(1, 3), seeds=3, budget=200)
    rows = samplers.run_samplers(cfg, progress=lambda *_: None)
    assert len(rows) == 2 * 3
    by = {(r["sampler"], r["J"]): r for r in rows}
    assert by["3-gibbs", 5.0]["reached"] == 3 and by["parallel", 5.0]["reached"] == 0
    assert by["parallel", 5.0]["steps_mean"] == 200
    assert "| parallel |" in samplers.markdown_table(rows)
