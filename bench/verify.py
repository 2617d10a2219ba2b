"""The check that a run's rows follow from its samples: ``verify_run`` recomputes every row's figures."""
from __future__ import annotations

import math
from typing import Any, Mapping

from bench import store as st
from bench.measure.quality import ar_trials_of
from bench.rows import CORE, compute_figures


def _close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys() and all(
            _close(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9)


def verify_run(run_dir) -> list[str]:
    """Recompute every row's figures from ``samples.jsonl``; returns the mismatches (empty: all agree).

    BLEU, chrF, stutter, latency percentiles and CIs, passes, the paired speedup, and the BLEU delta
    and sacrebleu's paired tests against the row's baseline are all recomputed with ``compute_figures``
    (the tests only for rows that carry them: older rows get them in the report, ``RunStore.report_rows``;
    with the trials the row's ``bleu_ar_signature`` names, so a row keeps verifying if the default changes).
    """
    run = st.RunStore(st.resolve_run_dir(run_dir))
    rows, groups = run.rows(), run.cells()
    settings = run.spec_settings()
    problems = [] if rows else ["rows.jsonl has no rows"]
    predates = {c.name for c in CORE if c.optional}
    for row in rows:
        g = groups.get(row.key)
        if not g:
            problems.append(f"{row.key}: no samples")
            continue
        bad_sample = [f for f in st.SAMPLE_FIELDS if any(f not in s for s in g)]
        if bad_sample:
            problems.append(f"{row.key}: samples lack {bad_sample}")
            continue
        refs = st.references(g)
        base = groups.get((row.baseline_system, row.test_set))
        base_ok = base is not None and [s["index"] for s in base] == [s["index"] for s in g]
        recomputed = compute_figures(
            [s["hypothesis"] for s in g], refs, [s["latency_ms"] for s in g], [s["passes"] for s in g],
            row.target_lang,
            [s["latency_ms"] for s in base] if base_ok and row.speedup_p50_vs_ar is not None else None,
            [s["hypothesis"] for s in base] if base_ok and row.bleu_delta_vs_ar is not None else None,
            settings["bootstrap_resamples"], score=row.bleu is not None,
            phase_ms=[s["phase_ms"] for s in g] if all("phase_ms" in s for s in g) else None,
            host_syncs=[s["host_syncs"] for s in g] if all("host_syncs" in s for s in g) else None,
            solo_ms=[s.get("solo_latency_ms") for s in g],
            valid_targets=[s["valid_targets"] for s in g] if all("valid_targets" in s for s in g) else None,
            tests=row.bleu_p_ar is not None, ar_trials=ar_trials_of(row.bleu_ar_signature))
        for name, value in recomputed.items():
            if row[name] is None and name in predates:      # a figure added after the row was written
                continue
            if not _close(row[name], value):
                problems.append(f"{row.key}: {name} = {row[name]!r} in rows.jsonl but {value!r} from samples")
    extra = set(groups) - {r.key for r in rows}
    if extra:
        problems.append(f"samples without a row (unfinished cells): {sorted(extra)}")
    return problems
