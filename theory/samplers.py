"""Dependent vs independent parallel updates: k-Gibbs vs the independent parallel sampler.

Paper Section 2.4.2, Appendix L.7 (Figure 3), Equation 5, Definitions 10-11, Propositions 4-5.

Model (Equation 5): N spins; a clique C_G = {0, ..., c-1} with coupling J on every ordered pair
i != j, plus N - c independent vertices; field h_i. Energy
    E(x) = sum_i h_i x_i + J ((sum_{i in C_G} x_i)^2 - c).
With sum_{C_G} h_i > 0 the mode R_1 (clique all +1, Equation 6) is larger than R_-1 (all -1, Eq. 7).
Every chain starts at the most likely state of R_-1 and runs until it first enters R_1 (or the budget
ends). States are integers (bit i set <=> x_i = +1); a k-Gibbs step samples the k chosen coordinates
jointly and exactly by masking the 2^N enumerated states to those agreeing with the current state
outside the block. All chains (couplings x k x seeds) run at once under vmap + lax.scan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from narbench_core.errors import UserError
from narbench_core.markdown import table

MAX_N = 14
PARALLEL = 0  # the k value that stands for the independent parallel sampler in rows


def spins(n: int) -> np.ndarray:
    """[2^n, n] in {-1, +1}: bit i of the row index set <=> x_i = +1."""
    s = np.arange(2**n)[:, None]
    return (((s >> np.arange(n)[None, :]) & 1) * 2 - 1).astype(np.float32)


def fields(n: int, h: float | np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.asarray(h, np.float32), (n,)).copy()


def energies(n: int, clique: int, J: float, h: np.ndarray) -> np.ndarray:
    """[2^n] energy of every state under Equation 5 (log p up to the partition function)."""
    x = spins(n)
    m = x[:, :clique].sum(1)
    return (x @ h + J * (m**2 - clique)).astype(np.float32)


def clique_mask(clique: int) -> int:
    return (1 << clique) - 1


def start_state(n: int, clique: int, h: np.ndarray) -> int:
    """Most likely state of R_-1: clique all -1, every independent vertex at the sign of its field."""
    return int(sum(1 << i for i in range(clique, n) if h[i] > 0))


def one_jump_steps(n: int, clique: int, k: int, J: float, h: np.ndarray) -> float:
    """Expected steps for k-Gibbs (k >= |C_G|) to jump from R_-1 straight into R_1: 1 / p with
    p = P(block covers C_G) * P(x_C = +1) (the clique is independent of the other vertices), the
    one-step probability behind Proposition 4. inf for k < |C_G|."""
    if k < clique:
        return math.inf
    cover = math.comb(n - clique, k - clique) / math.comb(n, k)
    xc = spins(clique)
    e = xc @ h[:clique] + J * (xc.sum(1) ** 2 - clique)          # [2^c] clique energies
    p_up = float(np.exp(e[-1] - np.logaddexp.reduce(e)))         # last row = all +1
    return 1.0 / (cover * p_up)


def _gibbs_step(state, key, k, energy, all_states, n):
    """One k-Gibbs step (Definition 10): a uniform block of size k, resampled jointly and exactly."""
    k_block, k_draw = jax.random.split(key)
    ranks = jnp.argsort(jnp.argsort(jax.random.uniform(k_block, (n,))))    # uniform random order
    block = jnp.sum(jnp.where(ranks < k, 1 << jnp.arange(n), 0))            # bitmask of |K| = k
    ok = ((all_states ^ state) & ~block) == 0                               # [2^n] agree off the block
    return jax.random.categorical(k_draw, jnp.where(ok, energy, -jnp.inf))


def _parallel_step(state, key, J, h, clique, n):
    """One independent parallel step (Definition 11): every x_i from p(x_i | x_{-i}) at once."""
    x = ((state >> jnp.arange(n)) & 1) * 2 - 1                              # [n] spins
    in_c = jnp.arange(n) < clique
    m = jnp.sum(jnp.where(in_c, x, 0))
    local = h + jnp.where(in_c, 2.0 * J * (m - x), 0.0)                     # [n] local fields
    up = jax.random.uniform(key, (n,)) < jax.nn.sigmoid(2.0 * local)
    return jnp.sum(jnp.where(up, 1 << jnp.arange(n), 0))


def hitting_times(n: int, clique: int, J: np.ndarray, k: np.ndarray, h: np.ndarray, budget: int,
                  keys: jnp.ndarray) -> np.ndarray:
    """[chains] first step t in 1..budget at which each chain is in R_1, or budget + 1 if never.

    J [chains] couplings, k [chains] block sizes (PARALLEL = 0: independent parallel sampler),
    keys [chains, 2] PRNG keys.
    """
    assert J.shape == k.shape == (keys.shape[0],), (J.shape, k.shape, keys.shape)
    all_states = jnp.arange(2**n)
    hj = jnp.asarray(h)
    target = clique_mask(clique)
    s0 = start_state(n, clique, h)

    def chain(Jc, kc, key):
        x = jnp.asarray(spins(n))
        m = x[:, :clique].sum(1)
        energy = x @ hj + Jc * (m**2 - clique)                                # [2^n]

        def step(carry, key_t):
            state, hit, t = carry
            new = jax.lax.cond(kc == PARALLEL,
                               lambda: _parallel_step(state, key_t, Jc, hj, clique, n),
                               lambda: _gibbs_step(state, key_t, kc, energy, all_states, n))
            hit = jnp.where((hit > budget) & ((new & target) == target), t, hit)
            return (new, hit, t + 1), None

        (_, hit, _), _ = jax.lax.scan(step, (jnp.asarray(s0), jnp.asarray(budget + 1), jnp.asarray(1)),
                                      jax.random.split(key, budget))
        return hit

    run = jax.jit(jax.vmap(chain))
    return np.asarray(run(jnp.asarray(J, jnp.float32), jnp.asarray(k, jnp.int32), keys))


@dataclass(frozen=True)
class SamplerConfig:
    n: int = 10
    clique: int = 4
    field: float = 5.0
    couplings: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0)
    ks: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 10)
    seeds: int = 10
    budget: int = 1000
    seed: int = 0

    def validate(self) -> None:
        if not 2 <= self.n <= MAX_N:
            raise UserError(f"--n must be in 2..{MAX_N} (k-Gibbs enumerates 2^N states), got {self.n}")
        if not 2 <= self.clique <= self.n:
            raise UserError(f"--clique must be in 2..N={self.n}, got {self.clique}")
        if self.field * self.clique <= 0:
            raise UserError("--field must be > 0 so that R_1 is the larger mode (sum of h over C_G > 0)")
        bad = [k for k in self.ks if not 1 <= k <= self.n]
        if bad:
            raise UserError(f"--ks values must be in 1..N={self.n}; got {bad}")
        if self.seeds < 2 or self.budget < 1 or min(self.couplings) < 0:
            raise UserError("need --seeds >= 2, --budget >= 1 and couplings J >= 0")


def run_samplers(cfg: SamplerConfig, progress=print) -> list[dict]:
    """Every (J, sampler) cell over cfg.seeds chains; one row per cell (no I/O)."""
    cfg.validate()
    h = fields(cfg.n, cfg.field)
    samplers = list(cfg.ks) + [PARALLEL]
    grid = [(J, k, s) for J in cfg.couplings for k in samplers for s in range(cfg.seeds)]
    Js = np.array([g[0] for g in grid], np.float32)
    ks = np.array([g[1] for g in grid], np.int32)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(cfg.seed), i))(jnp.arange(len(grid)))
    progress(f"samplers: {len(grid)} chains (J in {list(cfg.couplings)}, k in {list(cfg.ks)} + parallel, "
             f"{cfg.seeds} seeds, budget {cfg.budget} steps)")
    hits = hitting_times(cfg.n, cfg.clique, Js, ks, h, cfg.budget, keys)
    rows = []
    for J in cfg.couplings:
        for k in samplers:
            sel = (Js == np.float32(J)) & (ks == k)
            t = hits[sel]
            reached = t <= cfg.budget
            steps = np.minimum(t, cfg.budget).astype(float)   # as in Figure 3: not reached = budget
            rows.append(dict(
                J=float(J), sampler="parallel" if k == PARALLEL else f"{k}-gibbs",
                k=None if k == PARALLEL else int(k), n_vars=cfg.n, clique=cfg.clique, h=cfg.field,
                budget=cfg.budget, seeds=cfg.seeds, reached=int(reached.sum()),
                steps_mean=float(steps.mean()), steps_std=float(steps.std(ddof=1)),
                steps_median=float(np.median(steps)), steps=[int(v) for v in t],
                one_jump_estimate=None if k == PARALLEL or k < cfg.clique
                else one_jump_steps(cfg.n, cfg.clique, k, J, h)))
    return rows


def markdown_table(rows: list[dict]) -> str:
    """Rows = sampler, columns = J: mean steps to reach R_1 ± 0.5 stdev (reached/seeds)."""
    r0 = rows[0]
    Js = sorted({r["J"] for r in rows})
    names = list(dict.fromkeys(r["sampler"] for r in rows))
    cell = {(r["sampler"], r["J"]): r for r in rows}
    out = [f"### Steps from R_-1 to R_1: N = {r0['n_vars']}, |C_G| = {r0['clique']}, h_i = {r0['h']}, "
           f"budget {r0['budget']} steps, {r0['seeds']} seeds\n",
           "Mean ± 0.5·stdev of the steps (a chain that never reaches R_1 counts as the budget), then "
           "(chains that reached R_1 / seeds); in brackets, for k >= |C_G|, 1/p of the direct jump "
           "R_-1 -> R_1 (Proposition 4's one-step event).\n"]
    body = []
    for name in names:
        cells = []
        for J in Js:
            r = cell[name, J]
            est = f" [{r['one_jump_estimate']:.3g}]" if r["one_jump_estimate"] is not None else ""
            cells.append(f"{r['steps_mean']:.3g} ± {0.5 * r['steps_std']:.2g} ({r['reached']}/{r['seeds']}){est}")
        body.append([name, *cells])
    out += table(["sampler", *(f"J = {J:g}" for J in Js)], body, "l")
    return "\n".join(out) + "\n"
