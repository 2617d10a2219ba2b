"""Masking more is statistically better: fitting Ising models by k-pseudolikelihood.

Paper Section 3.1, Appendix L.6 (Figures 1-2), Definitions 2-3, Theorem 1, Appendix K.

Model (Equation K.57): p(x) ∝ exp(sum_i h_i x_i + sum_{i != j} J_ij x_i x_j), x in {-1, +1}^N, J
symmetric, so each unordered pair counts twice: energy = sum_i h_i x_i + 2 sum_{i<j} J_ij x_i x_j.
Parameters theta = (J_ij for i < j, then h_i): N(N-1)/2 + N numbers; the squared error is
||theta_hat - theta*||_2^2 over all of them.

States are integers s in [0, 2^N): bit i set <=> x_i = +1. Everything is exact: N is small, so the
2^N states are enumerated for sampling and for every conditional's normaliser.

k-MPLE (Definition 2 with Definition 3's masks): each training sample x^(i) comes with a mask K^(i)
drawn uniformly among the C(N, k) subsets of size k ("sampled", the paper's estimator), or the loss
averages over all subsets ("all"). Both reduce to weights w[K, x] over (mask, state) pairs:
    loss(theta) = sum_{K, x} w[K, x] * (logsumexp_{s: s_{-K} = x_{-K}} E(s) - E(x)),
which is convex in theta (Appendix K); gradient descent (steps of at least 1/(2L), L a proven bound on the
Hessian's largest eigenvalue) as the floor of a backtracking line search converges, and a small
gradient norm certifies near-optimality.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from narbench_core.errors import UserError
from narbench_core.markdown import table

MAX_N = 12  # 2^N states and [masks, 2^N, 2^N] consistency tables must stay small


def all_states(n: int) -> np.ndarray:
    """[2^n, n] spins in {-1, +1}; row s has x_i = +1 iff bit i of s is set."""
    s = np.arange(2**n)[:, None]
    return (((s >> np.arange(n)[None, :]) & 1) * 2 - 1).astype(np.float32)


def pairs(n: int) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(n), 2))


def num_params(n: int) -> int:
    return n * (n - 1) // 2 + n


def features(n: int) -> np.ndarray:
    """[2^n, P] sufficient statistics: 2 x_i x_j for i < j (both orders of K.57), then x_i."""
    x = all_states(n)
    pair_feats = [2.0 * x[:, i] * x[:, j] for i, j in pairs(n)]
    return np.stack(pair_feats + [x[:, i] for i in range(n)], axis=1).astype(np.float32)


def theta_of(n: int, J: float | np.ndarray, h: float | np.ndarray = 0.0) -> np.ndarray:
    """[P] parameter vector from a scalar/[n, n] coupling and a scalar/[n] field."""
    J = np.asarray(J, dtype=np.float32)
    Jp = np.full(len(pairs(n)), float(J)) if J.ndim == 0 else np.array([J[i, j] for i, j in pairs(n)])
    h = np.broadcast_to(np.asarray(h, dtype=np.float32), (n,))
    return np.concatenate([Jp, h]).astype(np.float32)


def smoothness_bound(n: int) -> float:
    """L >= largest Hessian eigenvalue of any weighted pseudolikelihood loss: the Hessian is an
    average of conditional covariances of the features, whose top eigenvalue is at most
    sum_j max |phi_j|^2 = 4 C(n, 2) + n."""
    return 4.0 * len(pairs(n)) + n


def log_probs(theta: jnp.ndarray, feats: jnp.ndarray) -> jnp.ndarray:
    """[2^n] exact log p_theta(s) by enumeration."""
    return jax.nn.log_softmax(feats @ theta)


def subset_masks(n: int, k: int) -> np.ndarray:
    """[C(n, k)] bitmasks of all subsets of size k, in lexicographic order."""
    if not 1 <= k <= n:
        raise UserError(f"k must be in 1..{n}, got {k}; pass --ks with values between 1 and N")
    return np.array([sum(1 << i for i in c) for c in itertools.combinations(range(n), k)], np.int64)


def consistency(n: int, masks: np.ndarray) -> np.ndarray:
    """[M, 2^n, 2^n] bool: cons[m, x, s] = (s agrees with x outside mask m)."""
    s = np.arange(2**n)
    diff = s[:, None] ^ s[None, :]                      # [x, s]
    return (diff[None] & ~masks[:, None, None]) == 0     # [M, x, s]


def pl_loss(theta: jnp.ndarray, weights: jnp.ndarray, cons: jnp.ndarray, feats: jnp.ndarray) -> jnp.ndarray:
    """Weighted pseudolikelihood loss. weights [M, S] (sum 1), cons [M, S, S], feats [S, P]."""
    energy = feats @ theta                                                  # [S]
    masked = jnp.where(cons, energy[None, None, :], -jnp.inf)               # [M, x, s]
    log_norm = jax.nn.logsumexp(masked, axis=-1)                            # [M, x]
    return jnp.sum(weights * (log_norm - energy[None, :]))


@dataclass(frozen=True)
class FitResult:
    theta: np.ndarray       # [B, P]
    grad_norm: np.ndarray   # [B] at the returned theta
    steps: np.ndarray       # [B] gradient steps taken
    converged: np.ndarray   # [B] bool: grad_norm <= tol


def fit(weights: np.ndarray, cons: np.ndarray, feats: np.ndarray, tol: float = 1e-6,
        max_steps: int = 5000) -> FitResult:
    """Gradient descent with backtracking (Armijo) step sizes on B convex problems at once (vmap).

    weights [B, M, S], cons [B, M, S, S]. Each step tries twice the last accepted step size and halves
    it until loss(theta - s g) <= loss(theta) - s/2 ||g||^2, which holds for every s <= 1/L
    (smoothness_bound), so accepted steps never fall below 1/(2L). Stops each problem when
    ||grad|| <= tol (for a convex loss, a certificate of near-optimality) or after max_steps.
    """
    assert weights.ndim == 3 and cons.ndim == 4, (weights.shape, cons.shape)
    with jax.enable_x64(True):  # float32 cannot resolve the Armijo decrease near the optimum
        return _fit64(np.asarray(weights, np.float64), np.asarray(cons), np.asarray(feats, np.float64),
                      tol, max_steps)


def _fit64(weights, cons, feats, tol, max_steps) -> FitResult:
    n = int(round(math.log2(feats.shape[0])))
    min_step = 0.5 / smoothness_bound(n)
    feats = jnp.asarray(feats)
    value_and_grad = jax.value_and_grad(pl_loss)

    def one(w, c):
        loss = lambda th: pl_loss(th, w, c, feats)

        def cond(carry):
            _, _, g, _, t = carry
            return (jnp.linalg.norm(g) > tol) & (t < max_steps)

        def body(carry):
            th, f, g, s, t = carry
            gg = jnp.sum(g * g)
            s = 2.0 * s
            s = jax.lax.while_loop(lambda s: (loss(th - s * g) > f - 0.5 * s * gg) & (s > min_step),
                                   lambda s: 0.5 * s, s)
            th = th - s * g
            f, g = value_and_grad(th, w, c, feats)
            return th, f, g, s, t + 1

        th0 = jnp.zeros(feats.shape[1], feats.dtype)
        f0, g0 = value_and_grad(th0, w, c, feats)
        th, _, g, _, t = jax.lax.while_loop(cond, body, (th0, f0, g0, jnp.asarray(1.0, feats.dtype), 0))
        return th, jnp.linalg.norm(g), t

    th, gn, t = jax.jit(jax.vmap(one))(jnp.asarray(weights), jnp.asarray(cons))
    gn = np.asarray(gn)
    return FitResult(np.asarray(th), gn, np.asarray(t), gn <= tol)


def asymptotic_trace(n: int, theta_star: np.ndarray, k: int, masks: str = "sampled") -> float:
    """Tr of the k-MPLE asymptotic covariance (Lemma 1): E||theta_hat - theta*||^2 ~ trace / n_train.

    With sampled masks the generalized information equality (Lemma 2) gives H^-1; with all masks
    averaged per sample it is H^-1 C H^-1, C = Cov_x(mean_K grad).
    """
    with jax.enable_x64(True):
        return _asymptotic_trace64(n, np.asarray(theta_star, np.float64), k, masks)


def _asymptotic_trace64(n, theta_star, k, masks) -> float:
    feats = jnp.asarray(features(n).astype(np.float64))
    m = subset_masks(n, k)
    cons = jnp.asarray(consistency(n, m))
    p = jnp.exp(log_probs(jnp.asarray(theta_star), feats))                # [S]
    w_pop = jnp.broadcast_to(p[None, :] / len(m), (len(m), 2**n))
    H = jax.hessian(pl_loss)(jnp.asarray(theta_star), w_pop, cons, feats)  # [P, P]
    if masks == "sampled":
        cov = H
    else:
        def mean_grad(x):
            w = jnp.zeros((len(m), 2**n)).at[:, x].set(1.0 / len(m))
            return jax.grad(pl_loss)(jnp.asarray(theta_star), w, cons, feats)
        g = jax.vmap(mean_grad)(jnp.arange(2**n))                          # [S, P]
        cov = (g * p[:, None]).T @ g                                        # mean grad is 0 at theta*
    Hinv = jnp.linalg.inv(H)
    return float(jnp.trace(Hinv @ cov @ Hinv))


@dataclass(frozen=True)
class IsingConfig:
    n: int = 4
    couplings: tuple[float, ...] = (0.05, 0.3)
    field: float = 0.0
    ks: tuple[int, ...] = ()            # empty: 1..n
    sizes: tuple[int, ...] = (250, 500, 1000, 2000, 4000, 8000, 16000)
    reps: int = 10
    masks: str = "sampled"              # "sampled" (Definition 2) or "all"
    tol: float = 1e-6
    max_steps: int = 3000
    seed: int = 0

    def resolved_ks(self) -> tuple[int, ...]:
        return tuple(self.ks) or tuple(range(1, self.n + 1))

    def validate(self) -> None:
        if not 2 <= self.n <= MAX_N:
            raise UserError(f"--n must be in 2..{MAX_N} (exact enumeration of 2^N states), got {self.n}")
        if self.masks not in ("sampled", "all"):
            raise UserError(f"--masks must be 'sampled' or 'all', got {self.masks!r}")
        if self.reps < 2 or min(self.sizes) < 1:
            raise UserError("--reps must be >= 2 and every --sizes value >= 1")
        for k in self.resolved_ks():
            subset_masks(self.n, k)


def mask_weights(x_idx: np.ndarray, mask_idx: np.ndarray, num_masks: int, pad_to: int, S: int,
                 masks: str) -> np.ndarray:
    """[pad_to, S] weights over (mask, state) from samples x_idx [n] and their mask ids [n]."""
    n_train = len(x_idx)
    if masks == "sampled":
        w = np.bincount(mask_idx * S + x_idx, minlength=num_masks * S).reshape(num_masks, S) / n_train
    else:
        w = np.broadcast_to(np.bincount(x_idx, minlength=S) / (n_train * num_masks), (num_masks, S))
    out = np.zeros((pad_to, S), np.float32)
    out[:num_masks] = w
    return out


def run_ising(cfg: IsingConfig, progress=print) -> list[dict]:
    """All (J, k, size) cells, 10 repetitions each; returns one row per cell (no I/O)."""
    cfg.validate()
    n, S, ks = cfg.n, 2**cfg.n, cfg.resolved_ks()
    feats = features(n)
    mask_sets = {k: subset_masks(n, k) for k in ks}
    pad = max(len(m) for m in mask_sets.values())
    # pad with the full mask; padded rows get zero weight
    cons_k = {k: consistency(n, np.concatenate([m, np.full(pad - len(m), 2**n - 1)])) for k, m in mask_sets.items()}
    rows = []
    for ji, J in enumerate(cfg.couplings):
        theta_star = theta_of(n, J, cfg.field)
        logp = log_probs(jnp.asarray(theta_star), jnp.asarray(feats))
        key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), ji)
        k_data, k_mask = jax.random.split(key)
        # one nested training set per repetition, shared by every k and size
        data = np.asarray(jax.random.categorical(k_data, logp, shape=(cfg.reps, max(cfg.sizes))))
        cells, W, C = [], [], []
        for k in ks:
            mk = np.asarray(jax.random.randint(jax.random.fold_in(k_mask, k), (cfg.reps, max(cfg.sizes)),
                                               0, len(mask_sets[k])))
            for size in cfg.sizes:
                for r in range(cfg.reps):
                    W.append(mask_weights(data[r, :size], mk[r, :size], len(mask_sets[k]), pad, S, cfg.masks))
                    C.append(cons_k[k])
                    cells.append((k, size, r))
        progress(f"ising J={J}: fitting {len(cells)} problems (k in {list(ks)}, sizes {list(cfg.sizes)}, "
                 f"{cfg.reps} reps)")
        res = fit(np.stack(W), np.stack(C), feats, tol=cfg.tol, max_steps=cfg.max_steps)
        err = np.sum((res.theta - theta_star[None]) ** 2, axis=1)
        for k in ks:
            tr = asymptotic_trace(n, theta_star, k, cfg.masks)
            for size in cfg.sizes:
                idx = [i for i, c in enumerate(cells) if c[0] == k and c[1] == size]
                e = err[idx]
                rows.append(dict(
                    J=float(J), h=float(cfg.field), n_vars=n, k=int(k), n_train=int(size), masks=cfg.masks,
                    reps=cfg.reps, sq_error_mean=float(e.mean()), sq_error_std=float(e.std(ddof=1)),
                    sq_errors=[float(v) for v in e], asymptotic_sq_error=tr / size,
                    converged=int(res.converged[idx].sum()), grad_norm_max=float(res.grad_norm[idx].max()),
                    gd_steps_max=int(res.steps[idx].max()), tol=cfg.tol))
    return rows


def markdown_table(rows: list[dict]) -> str:
    """One table per J: rows = training size, columns = k (mean ± 0.5 std of the squared error)."""
    out = []
    for J in sorted({r["J"] for r in rows}):
        rj = [r for r in rows if r["J"] == J]
        ks = sorted({r["k"] for r in rj})
        sizes = sorted({r["n_train"] for r in rj})
        cell = {(r["k"], r["n_train"]): r for r in rj}
        out.append(f"### J = {J}, N = {rj[0]['n_vars']}, h = {rj[0]['h']} ({rj[0]['masks']} masks, "
                   f"{rj[0]['reps']} repetitions)\n")
        out.append("Squared parameter error, mean ± 0.5·stdev (asymptotic Tr(Γ_k)/n in brackets)\n")
        out += table(["n_train", *(f"k = {k}" for k in ks)], ([s, *(_cell(cell[k, s]) for k in ks)] for s in sizes))
        if any(r["converged"] < r["reps"] for r in rj):
            out.append("\n`*c/r`: only c of r fits reached the gradient tolerance (on small training sets the "
                       "k-MPLE can lack a finite minimiser; the estimate is then the last iterate).")
        conv = sum(r["converged"] for r in rj)
        total = sum(r["reps"] for r in rj)
        out.append(f"\nConvergence (convex loss, Appendix K): {conv}/{total} fits reached "
                   f"||grad|| <= {rj[0]['tol']:g}; largest final ||grad|| = "
                   f"{max(r['grad_norm_max'] for r in rj):.1e}; most GD steps = {max(r['gd_steps_max'] for r in rj)}.\n")
    return "\n".join(out)


def _cell(r: dict) -> str:
    text = f"{r['sq_error_mean']:.2e} ± {0.5 * r['sq_error_std']:.1e} [{r['asymptotic_sq_error']:.1e}]"
    return text if r["converged"] == r["reps"] else f"{text} *{r['converged']}/{r['reps']}"
