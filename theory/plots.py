"""Figures for the theory suites (matplotlib, Agg): Figures 1-3 of the paper, from result rows."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def ising_figure(rows: list[dict], J: float):
    """Figures 1-2: squared parameter error vs training-set size, one line per k, ± 0.5 stdev bars;
    dotted lines: the asymptotic prediction Tr(Γ_k) / n."""
    rj = [r for r in rows if r["J"] == J]
    ks = sorted({r["k"] for r in rj})
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    colors = plt.cm.viridis(np.linspace(0.0, 0.85, len(ks)))
    for k, c in zip(ks, colors):
        rk = sorted((r for r in rj if r["k"] == k), key=lambda r: r["n_train"])
        n = np.array([r["n_train"] for r in rk])
        m = np.array([r["sq_error_mean"] for r in rk])
        half = 0.5 * np.array([r["sq_error_std"] for r in rk])
        # a log axis cannot show a bar below zero: clip the lower end just above zero
        lower = np.minimum(half, 0.95 * m)
        ax.errorbar(n, m, yerr=[lower, half], marker="o", ms=4, capsize=3, color=c, label=f"k = {k}")
        ax.plot(n, [r["asymptotic_sq_error"] for r in rk], ls=":", color=c, lw=1)
    r0 = rj[0]
    ax.set(xscale="log", yscale="log", xlabel="training set size n",
           ylabel=r"squared parameter error $\|\hat\theta-\theta^*\|_2^2$",
           title=f"k-pseudolikelihood on an Ising model (N = |C_G| = {r0['n_vars']}, J = {J:g}, h = {r0['h']:g})")
    ax.title.set_fontsize(10)
    ax.grid(True, which="both", alpha=0.3)
    ax.plot([], [], ls=":", color="gray", label=r"asymptotic Tr($\Gamma_k$)/n")
    ax.legend(fontsize=9)
    fig.text(0.01, -0.02, f"mean over {r0['reps']} repetitions, error bars ± 0.5 stdev; {r0['masks']} masks",
             fontsize=8, color="dimgray")
    return fig


def samplers_figure(rows: list[dict]):
    """Figure 3: steps from R_-1 to R_1 vs J, one line per k-Gibbs sampler plus the independent
    parallel sampler (dashed); ± 0.5 stdev bars; the budget line marks chains that never arrived."""
    r0 = rows[0]
    names = list(dict.fromkeys(r["sampler"] for r in rows))
    gibbs = [s for s in names if s != "parallel"]
    fig, ax = plt.subplots(figsize=(6.8, 4.8))
    colors = plt.cm.plasma(np.linspace(0.0, 0.85, len(gibbs)))
    for name in names:
        rs = sorted((r for r in rows if r["sampler"] == name), key=lambda r: r["J"])
        J = np.array([r["J"] for r in rs])
        m = np.array([r["steps_mean"] for r in rs])
        half = 0.5 * np.array([r["steps_std"] for r in rs])
        lower = np.minimum(half, 0.5 * m)
        if name == "parallel":
            kw = dict(color="black", ls="--", marker="s", label="independent parallel")
        else:
            k = int(name.split("-")[0])
            kw = dict(color=colors[gibbs.index(name)], marker="o",
                      label=f"{name}" + (" (k ≥ |C_G|)" if k >= r0["clique"] else ""))
        ax.errorbar(J, m, yerr=[lower, half], capsize=3, ms=4, **kw)
    ax.axhline(r0["budget"], color="red", lw=0.8, alpha=0.6)
    ax.text(ax.get_xlim()[0], r0["budget"] * 1.15, f"budget {r0['budget']} steps = never reached",
            fontsize=8, color="red")
    ax.set(yscale="log", xlabel="coupling J (larger = more peaky)", ylabel=r"steps to reach $R_1$",
           ylim=(0.7, r0["budget"] * 2.2))
    ax.set_title(f"Reaching the larger mode $R_1$ from $R_{{-1}}$ (N = {r0['n_vars']}, |C_G| = {r0['clique']}, "
                 f"h_i = {r0['h']:g})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.text(0.01, -0.02, f"mean over {r0['seeds']} seeds, error bars ± 0.5 stdev", fontsize=8, color="dimgray")
    return fig
