"""Which target positions depend on each other? Attention statistics of adjacent pairs (stutter vs not).

Paper Section 3.4, Appendix L.5, Tables 4-5. For every adjacent pair (i, i+1) of an output sequence,
split by stutter (same token at i and i+1) or not:

- Table 4, last-layer decoder self-attention: the score a[h, i, i+1] and a[h, i+1, i] (both
  directions, each direction one entry), reduced over heads by min / avg / max; and P{top-k overlap}:
  the share of (pair, direction, head) where the attending position has the other position among its
  k most attended-to positions.
- Table 5, last-layer cross-attention: distance between the two positions' distributions over the
  source, per head: total variation (1/2 sum |p - q|) and cosine distance (1 - cos(p, q); both in
  [0, 1]), reduced over heads by min / avg / max; and P{top-k overlap}: the share of (pair, head)
  whose two top-k source-position sets intersect.

Entries are mean ± std over pairs (over (pair, direction) for self-attention scores). Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from narbench_core.markdown import table

TOPK = (1, 2)


def _topk_sets(weights: np.ndarray, k: int) -> np.ndarray:
    """[..., L] weights -> [..., k] indices of the k largest (ties: lower index first)."""
    return np.argsort(-weights, axis=-1, kind="stable")[..., :k]


@dataclass
class PairStats:
    """Per-pair entries from one or more sentences (concatenated along the pair axis)."""
    stutter: np.ndarray                        # [P] bool
    self_scores: np.ndarray                    # [P, 2, H] a[h,i,i+1] and a[h,i+1,i]
    self_topk: dict = field(default_factory=dict)   # k -> [P, 2, H] bool
    tv: np.ndarray = None                      # [P, H]
    cosine: np.ndarray = None                  # [P, H]
    cross_topk: dict = field(default_factory=dict)  # k -> [P, H] bool


def sentence_pair_stats(self_attn: np.ndarray, cross_attn: np.ndarray, tokens: np.ndarray,
                        ks: tuple[int, ...] = TOPK) -> PairStats:
    """Statistics of the n-1 adjacent pairs of one output sentence.

    self_attn [H, n, n] (row = query position, a distribution over key positions), cross_attn
    [H, n, src] (row = target position, a distribution over source positions), tokens [n]; all
    already cut to the sentence's real target and source lengths.
    """
    self_attn, cross_attn, tokens = np.asarray(self_attn, np.float64), np.asarray(cross_attn, np.float64), np.asarray(tokens)
    assert self_attn.ndim == 3 and cross_attn.ndim == 3 and tokens.ndim == 1, (self_attn.shape, cross_attn.shape, tokens.shape)
    H, n, _ = self_attn.shape
    assert self_attn.shape == (H, n, n) and cross_attn.shape[:2] == (H, n) and len(tokens) == n
    i = np.arange(n - 1)
    j = i + 1
    fwd = self_attn[:, i, j].T                                      # [P, H] i attends to i+1
    bwd = self_attn[:, j, i].T                                      # [P, H] i+1 attends to i
    stats = PairStats(stutter=tokens[i] == tokens[j], self_scores=np.stack([fwd, bwd], axis=1))
    for k in ks:
        top = _topk_sets(self_attn, k)                              # [H, n, k]
        f = (top[:, i] == j[None, :, None]).any(-1).T               # [P, H]
        b = (top[:, j] == i[None, :, None]).any(-1).T
        stats.self_topk[k] = np.stack([f, b], axis=1)               # [P, 2, H]
    p, q = cross_attn[:, i], cross_attn[:, j]                       # [H, P, src]
    stats.tv = (0.5 * np.abs(p - q).sum(-1)).T                      # [P, H]
    cos = (p * q).sum(-1) / np.maximum(np.linalg.norm(p, axis=-1) * np.linalg.norm(q, axis=-1), 1e-30)
    stats.cosine = np.clip(1.0 - cos, 0.0, 1.0).T                   # [P, H]
    for k in ks:
        tp, tq = _topk_sets(p, k), _topk_sets(q, k)                 # [H, P, k]
        stats.cross_topk[k] = (tp[..., :, None] == tq[..., None, :]).any((-1, -2)).T   # [P, H]
    return stats


def concat(parts: list[PairStats]) -> PairStats:
    """Pool the pairs of many sentences."""
    ks = list(parts[0].self_topk)
    cat = lambda xs: np.concatenate(xs, axis=0)
    return PairStats(
        stutter=cat([p.stutter for p in parts]), self_scores=cat([p.self_scores for p in parts]),
        self_topk={k: cat([p.self_topk[k] for p in parts]) for k in ks},
        tv=cat([p.tv for p in parts]), cosine=cat([p.cosine for p in parts]),
        cross_topk={k: cat([p.cross_topk[k] for p in parts]) for k in ks})


def _mean_std(x: np.ndarray) -> list[float] | None:
    return [float(x.mean()), float(x.std())] if x.size else None


def summarize(stats: PairStats) -> list[dict]:
    """Two rows (stutter yes / no) with Tables 4-5's columns; values are [mean, std] or a share."""
    rows = []
    for flag in (True, False):
        sel = stats.stutter == flag
        s = stats.self_scores[sel].reshape(-1, stats.self_scores.shape[-1])     # [(pair, dir), H]
        row = {"stutter": flag, "pairs": int(sel.sum())}
        for name, red in (("min", np.min), ("avg", np.mean), ("max", np.max)):
            row[f"self_{name}"] = _mean_std(red(s, axis=-1)) if s.size else None
            row[f"tv_{name}"] = _mean_std(red(stats.tv[sel], axis=-1)) if sel.any() else None
            row[f"cos_{name}"] = _mean_std(red(stats.cosine[sel], axis=-1)) if sel.any() else None
        for k in stats.self_topk:
            row[f"self_top{k}"] = float(stats.self_topk[k][sel].mean()) if sel.any() else None
            row[f"cross_top{k}"] = float(stats.cross_topk[k][sel].mean()) if sel.any() else None
        rows.append(row)
    return rows


def _ms(v, digits=4) -> str:
    return "n/a" if v is None else f"{v[0]:.{digits}f} ± {v[1]:.{digits}f}"


def _p(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def markdown_tables(rows: list[dict]) -> str:
    """Tables 4 and 5 of the paper, same layout."""
    ks = sorted(int(key[len("self_top"):]) for key in rows[0] if key.startswith("self_top"))
    yes_no = lambda r: f"{'yes' if r['stutter'] else 'no'} ({r['pairs']} pairs)"
    overlaps = [f"P(top-{k} overlap)" for k in ks]
    out = ["### Table 4: last-layer decoder self-attention between adjacent positions\n",
           *table(["stutter", "min", "avg", "max", *overlaps],
                  ([yes_no(r), _ms(r["self_min"]), _ms(r["self_avg"], 3), _ms(r["self_max"], 2),
                    *(_p(r[f"self_top{k}"]) for k in ks)] for r in rows), "l"),
           "", "### Table 5: distance between adjacent positions' last-layer cross-attention distributions\n",
           *table(["stutter", "TV min", "TV avg", "TV max", "cos min", "cos avg", "cos max", *overlaps],
                  ([yes_no(r), *(_ms(r[f"{m}_{red}"], 2) for m in ("tv", "cos") for red in ("min", "avg", "max")),
                    *(_p(r[f"cross_top{k}"]) for k in ks)] for r in rows), "l")]
    return "\n".join(out) + "\n"
