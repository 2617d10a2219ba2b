"""bench.latency_map: the latency map's cells, resume, rows, cost model (fit on some sizes, score on the
others), projections, report and plot; on fake jitted decoders, plus one cell of real tiny decoders."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from bench import latency_map as sm
from bench.costs.machine import MachinePeaks, MachineRates
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl, write_jsonl
from fakes import JittedDecoder, saved_figures

PEAKS = MachinePeaks("test", 1e11, 1e10, "x", 8, 8)
# Measured-rate stand-ins: GEMM flop/s grow with rows, bandwidth falls past a 1 MB "cache".
_GEMM = {"1": 2e9, "64": 2e10, "4096": 5e10}
# Batched dots: single-query (AR-like) slower than many-query; layout moves slower past 1 MB.
RATES = MachineRates({"16,16": _GEMM, "32,32": {k: 1.5 * v for k, v in _GEMM.items()}},
                     {"1000": 4e10, "1000000": 4e10, "4000000": 1e10, "1000000000": 1e10}, "2024-01-01", "test",
                     dots={"8,1,64,16": 3e9, "8,16,64,16": 2e10}, moves={"1000": 2e10, "1000000": 2e10, "4000000": 2e9})
ENV = {"cpu_model": "Test CPU", "threads": 2, "platform": "cpu"}
SPEC = sm.MapSpec(sizes=("s", "m"), lengths=(8, 16), batches=(1, 2), iterations=(1, 4), length_hyps=(1, 2),
                  calibrate=("s",), cell_seconds=0.05, min_calls=3, max_calls=4)


class FakeFactory:
    """Jitted fake decoders: AR runs ``length`` passes, PaDIR T passes; width grows with the size."""

    def __init__(self, fail_at: int | None = None):
        self.built: list[tuple] = []
        self.fail_at = fail_at

    def __call__(self, cell, systems):
        if self.fail_at is not None and len(self.built) == self.fail_at:
            raise KeyboardInterrupt            # a kill in the middle of the map
        self.built.append(cell.key)
        dim = {"s": 16, "m": 32}[cell.size]
        return [JittedDecoder(s.name, passes=cell.length if s.iterations == 0 else s.iterations, dim=dim,
                              buckets=(cell.length,)) for s in systems]


def test_cells_run_cheapest_first_and_systems_follow_the_axes():
    cells = SPEC.cells()
    assert [c.key for c in cells] == [("s", 8, 1), ("m", 8, 1),                        # tokens per call,
                                      ("s", 8, 2), ("s", 16, 1), ("m", 8, 2), ("m", 16, 1),  # size, length
                                      ("s", 16, 2), ("m", 16, 2)]
    assert [s.name for s in SPEC.systems()] == ["ar-greedy", "padir-T1-k1", "padir-T4-k1", "padir-T1-k2",
                                                "padir-T4-k2"]


@pytest.mark.parametrize("changes, message", [
    (dict(calibrate=("big",)), "calibration sizes"),
    (dict(lengths=(0, 8)), "lengths must be whole numbers"),
    (dict(min_calls=5, max_calls=2), "min_calls <= max_calls"),
    (dict(length_hyps=()), "at least one value of length_hyps"),
])
def test_bad_map_settings_are_user_errors(changes, message):
    with pytest.raises(UserError, match=message):
        sm.MapSpec(**{**SPEC.to_dict(), **changes})


def test_cost_model_fitted_on_one_size_predicts_another():
    """Latencies made by a known linear model: the fit on size "s" recovers it and predicts "m" exactly."""
    coef = np.array([0.5, 0.02, 0.004, 1.2])
    rng = np.random.default_rng(0)
    rows = []
    for size, scale, dims in (("s", 1.0, [16, 16]), ("m", 8.0, [32, 32])):
        for _ in range(12):
            row = {"size": size, "passes": int(rng.integers(1, 64)), "gemm_dims": dims,
                   "encode_flops": scale * rng.uniform(1e6, 1e9), "pass_flops": scale * rng.uniform(1e5, 1e8),
                   "encode_bytes": scale * rng.uniform(1e5, 1e8), "pass_bytes": scale * rng.uniform(1e4, 1e7),
                   "encode_rows": int(rng.integers(1, 4096)), "pass_rows": int(rng.integers(1, 4096)),
                   "encode_dots": {"8,16,64,16": scale * rng.uniform(1e4, 1e5)},
                   "pass_dots": {"8,1,64,16": scale * rng.uniform(1e3, 1e5)},
                   "encode_moves": {"4096": float(rng.integers(0, 9))},
                   "pass_moves": {str(int(scale * 2**20)): float(rng.integers(0, 40))},
                   "ops": float(rng.integers(50, 5000))}
            row["latency_p50_ms"] = float(sm.features(row, RATES) @ coef)
            rows.append(row)
    model = sm.CostModel.fit(rows, RATES, ["s"])
    np.testing.assert_allclose(model.coef, coef, rtol=1e-6)
    scored = sm.apply_model(rows, model, RATES)
    assert sm.prediction_score(scored) == (12, 12)
    assert all(r["calibration"] == (r["size"] == "s") for r in scored)
    # A model that is wrong on "m" scores as such.
    off = [dict(r, latency_p50_ms=r["latency_p50_ms"] * (2.0 if r["size"] == "m" else 1.0)) for r in rows]
    assert sm.prediction_score(sm.apply_model(off, sm.CostModel.fit(off, RATES, ["s"]), RATES)) == (0, 12)


def test_features_use_the_rate_of_each_part_s_rows_and_working_set():
    row = {"passes": 3, "gemm_dims": [16, 16], "encode_flops": 2e9, "pass_flops": 2e8, "encode_bytes": 1e6,
           "pass_bytes": 1e9, "encode_rows": 64, "pass_rows": 1, "ops": 120.0,
           "encode_dots": {"8,16,64,16": 4e8}, "pass_dots": {"8,1,64,16": 3e7},
           "encode_moves": {"1000000": 2.0}, "pass_moves": {"4000000": 5.0}}
    compute = 1e3 * ((2e9 - 4e8) / 2e10 + 3 * (2e8 - 3e7) / 2e9)    # the rest of the flops: 64 rows, then one
    attention = 1e3 * (4e8 / 2e10 + 3 * 3e7 / 3e9)                 # each dot at its own rate
    layout = 1e3 * (2 * 1e6 / 2e10 + 3 * 5 * 4e6 / 2e9)            # each move at its size's rate
    memory = 1e3 * (1e6 / 4e10 + 3 * 1e9 / 1e10)                    # 1 MB in "cache", 1 GB from "DRAM"
    parts = sm.work_ms(row, RATES)
    np.testing.assert_allclose([parts[k] for k in sm.WORK], [compute, attention, layout, memory])
    np.testing.assert_allclose(sm.features(row, RATES), [1.0, 3.0, 120.0, compute + attention + layout + memory])


def test_cost_model_needs_enough_rows():
    with pytest.raises(UserError, match="at least 4 timed rows"):
        sm.CostModel.fit([{"size": "s", "passes": 1, "flops": 1.0, "bytes": 1.0, "latency_p50_ms": 1.0}], PEAKS, ["s"])


def test_map_runs_every_cell_and_resumes_after_a_kill(tmp_path):
    first = FakeFactory(fail_at=3)
    with pytest.raises(KeyboardInterrupt):
        sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=first, peaks=PEAKS, env=ENV, progress=False,
                   rates=RATES)
    (run_dir,) = (tmp_path / "speedmap").iterdir()
    assert {(r["size"], r["target_length"], r["batch_size"]) for r in read_jsonl(run_dir / sm.ROWS)} == set(first.built)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    assert "**Unfinished map**: 3 of 8 cells timed so far" in (run_dir / sm.TABLE).read_text()

    second = FakeFactory()
    assert sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=second, peaks=PEAKS, env=ENV,
                      progress=False, rates=RATES) == run_dir
    assert second.built == [c.key for c in SPEC.cells()][3:]          # only the missing cells ran
    rows = read_jsonl(run_dir / sm.ROWS)
    assert len(rows) == len(SPEC.cells()) * len(SPEC.systems())
    for r in rows:
        assert r["calls"] == len(r["latencies_ms"]) and SPEC.min_calls <= r["calls"] <= SPEC.max_calls
        assert r["latency_p50_ms"] == pytest.approx(float(np.median(r["latencies_ms"])))
        assert r["passes"] == (r["target_length"] if r["family"] == "ar" else r["iterations"])
        assert r["flops"] == pytest.approx(r["encode_flops"] + r["passes"] * r["pass_flops"])
        assert r["predicted_p50_ms"] > 0 and r["calibration"] == (r["size"] == "s")
        assert r["cpu_model"] == "Test CPU"
        for name in sm.PROJECTED:
            assert r[f"projection_{name}_ms"] > 0
        ar = next(a for a in rows if a["family"] == "ar" and a["size"] == r["size"]
                  and a["target_length"] == r["target_length"] and a["batch_size"] == r["batch_size"])
        assert r["speedup_p50_vs_ar"] == pytest.approx(ar["latency_p50_ms"] / r["latency_p50_ms"])
        assert set(r["phase_p50_ms"]) >= {"tokenize", "passes", "detokenize"}
    assert (run_dir / sm.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sm.load_rates(run_dir) == RATES
    for r in rows:
        assert r["gemm_dims"] == ([16, 16] if r["size"] == "s" else [32, 32]) and r["pass_ops"] >= 1
        assert r["encode_rows"] == r["batch_size"] * r["target_length"]
        assert r["pass_rows"] == r["batch_size"] * r["length_hyps"] * (1 if r["family"] == "ar" else r["target_length"])
    text = (run_dir / sm.TABLE).read_text()
    assert "## m, batch 2: PaDIR speedup over AR greedy (p50)" in text and "Test CPU" in text
    assert "Rows it was **not** fitted on:" in text and "of 20 (" in text
    assert "Projections (roofline bounds, not measurements)" in text and "Unfinished" not in text
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_a_map_timed_on_a_gpu_is_not_resumed_on_another_machine(tmp_path):
    """Cells timed on one device are never joined by cells timed on another: resuming is refused in one line
    and the timed rows stay as they were; the same device resumes."""
    gpu = {**ENV, "cpu_signature": "Host CPU (family 6)", "platform": "gpu", "device_kind": "NVIDIA H200"}
    with pytest.raises(KeyboardInterrupt):
        sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=FakeFactory(fail_at=2), peaks=PEAKS, env=gpu,
                   progress=False, rates=RATES)
    (run_dir,) = (tmp_path / "speedmap").iterdir()
    timed = (run_dir / sm.ROWS).read_text()
    for other, says in [({**gpu, "platform": "cpu", "device_kind": "cpu"}, "this machine is Host CPU (family 6):"),
                        ({**gpu, "device_kind": "NVIDIA H100"}, "this machine is NVIDIA H100 (gpu)"),
                        ({**gpu, "cpu_signature": "Other CPU (family 25)"}, "on Other CPU (family 25)")]:
        with pytest.raises(UserError, match="timed on NVIDIA H200 \\(gpu\\) on Host CPU \\(family 6\\)") as err:
            sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=other,
                       progress=False, rates=RATES)
        assert says in str(err.value) and "--force" in str(err.value)
        assert (run_dir / sm.ROWS).read_text() == timed
    again = FakeFactory()
    assert sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=again, peaks=PEAKS,
                      env={**gpu, "device_driver": "a newer driver"}, progress=False, rates=RATES) == run_dir
    assert again.built == [c.key for c in SPEC.cells()][2:]


def test_a_map_timed_elsewhere_resumes_under_another_out_root_with_only_its_missing_cells(tmp_path):
    """--resume-from: a GPU map cut short on one lease (committed) goes on in the next lease's fresh folder."""
    gpu = {**ENV, "cpu_signature": "Host CPU (family 6)", "platform": "gpu", "device_kind": "NVIDIA H200"}
    with pytest.raises(KeyboardInterrupt):
        sm.run_map(SPEC, tmp_path / "lease1", "narbench latency --map", factory=FakeFactory(fail_at=3), peaks=PEAKS,
                   env=gpu, progress=False, rates=RATES)
    (run_dir,) = (tmp_path / "lease1" / "speedmap").iterdir()
    committed = run_dir.rename(tmp_path / "lease1" / "copied-under-another-name")
    timed = read_jsonl(committed / sm.ROWS)

    def resume(source, spec=SPEC, env=gpu, factory=None, out="lease2"):
        return sm.run_map(spec, tmp_path / out, "narbench latency --map", factory=factory or FakeFactory(),
                          peaks=PEAKS, env=env, progress=False, rates=RATES, resume_from=source)

    for source, spec, env, says in [
            (tmp_path, SPEC, gpu, "not a latency map's run folder"),
            (committed, sm.MapSpec(**{**SPEC.to_dict(), "batches": (1,)}), gpu, "its settings (its spec.toml) differ"),
            (committed, SPEC, {**gpu, "device_kind": "NVIDIA H100"}, "timed on NVIDIA H200 (gpu)"),
            (committed, SPEC, {**gpu, "platform": "cpu"}, "drop --resume-from to start a new map")]:
        with pytest.raises(UserError, match=re.escape(says)):
            resume(source, spec, env)
        assert not (tmp_path / "lease2").exists()                  # refused before anything is copied
    second = FakeFactory()
    run_dir = resume(committed, factory=second)
    assert run_dir == tmp_path / "lease2" / "speedmap" / json.loads((committed / "run.json").read_text())["run_id"]
    assert second.built == [c.key for c in SPEC.cells()][3:]          # only the cells the first lease missed
    rows = read_jsonl(run_dir / sm.ROWS)
    assert len(rows) == len(SPEC.cells()) * len(SPEC.systems())
    assert [r["latencies_ms"] for r in rows[:len(timed)]] == [r["latencies_ms"] for r in timed]   # kept, not re-timed
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    assert read_jsonl(committed / sm.ROWS) == timed                    # the source is left as it was
    with pytest.raises(UserError, match="every cell of it is timed already"):
        resume(run_dir, out="lease3")


def test_crossover_plot_draws_every_padir_system_per_cell(tmp_path):
    run_dir = sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=ENV,
                         progress=False, rates=RATES)
    rows = read_jsonl(run_dir / sm.ROWS)
    with saved_figures() as figures:
        sm.plot_crossover(rows, SPEC, tmp_path / "x.png")
    axes = figures["x.png"].axes
    assert len(axes) == len(SPEC.sizes) * len(SPEC.batches)
    assert axes[0].get_ylabel() == "speedup vs AR greedy (p50)" and axes[-1].get_xlabel() == "target length (tokens)"
    for ax in axes:
        lines = [line for line in ax.get_lines() if line.get_label().startswith("T=")]
        assert len(lines) == len(SPEC.length_hyps) * len(SPEC.iterations)
        assert all(list(line.get_xdata()) == sorted(SPEC.lengths) for line in lines)


def test_rows_of_an_older_cost_method_are_recosted_on_resume_without_timing(tmp_path):
    run_dir = sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=ENV,
                         progress=False, rates=RATES)
    fresh = read_jsonl(run_dir / sm.ROWS)
    assert {r["cost_method"] for r in fresh} == {sm.COST_METHOD}
    old = [{k: (v * 3 if k in ("pass_flops", "flops") else v) for k, v in r.items() if k != "cost_method"}
           for r in fresh[:5]] + fresh[5:]                         # one cell's rows from an earlier method
    write_jsonl(run_dir / sm.ROWS, old)
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**info, "status": "running"}))   # as if killed at the end
    again = FakeFactory()
    assert sm.run_map(SPEC, tmp_path, "narbench latency --map", factory=again, peaks=PEAKS, env=ENV,
                      progress=False, rates=RATES) == run_dir
    assert again.built == [("s", 8, 1)]                            # built to cost that cell, not timed
    rows = read_jsonl(run_dir / sm.ROWS)
    for a, b in zip(rows, fresh):
        assert (a["pass_flops"], a["flops"], a["cost_method"]) == (b["pass_flops"], b["flops"], sm.COST_METHOD)
        assert a["latencies_ms"] == b["latencies_ms"]


def test_one_cell_of_real_tiny_decoders(tmp_path):
    """The harness's decoders on random tiny models: AR runs exactly `length` decoder passes, PaDIR exactly T
    passes, and PaDIR systems that differ only in T share their per-pass cost, which grows with k."""
    spec = sm.MapSpec(sizes=("tiny",), lengths=(8,), batches=(1,), iterations=(1, 2), length_hyps=(1, 2), calibrate=("tiny",),
                      cell_seconds=0.01, min_calls=2, max_calls=2)
    from models.config import preset

    tiny = preset("tiny")
    rates = MachineRates({f"{tiny.d_model},{tiny.d_ff}": _GEMM}, RATES.stream, "2024-01-01", "test",
                         moves=RATES.moves)
    run_dir = sm.run_map(spec, tmp_path, "narbench latency --map", peaks=PEAKS, env=ENV, progress=False,
                         rates=rates)
    rows = {r["system"]: r for r in read_jsonl(run_dir / sm.ROWS)}
    # Attention's products are found in the programs, and their rates measured for the map (not given).
    dots = {k for r in rows.values() for part in ("encode_dots", "pass_dots") for k in r[part]}
    assert all(r["encode_dots"] for r in rows.values()) and rows["padir-T1-k1"]["pass_dots"]
    assert set(sm.load_rates(run_dir).dots) == dots
    assert rows["ar-greedy"]["passes"] == 8
    assert [rows[f"padir-T{t}-k1"]["passes"] for t in (1, 2)] == [1, 2]
    assert rows["padir-T1-k1"]["pass_flops"] == rows["padir-T2-k1"]["pass_flops"]
    assert 1.8 < rows["padir-T1-k2"]["pass_flops"] / rows["padir-T1-k1"]["pass_flops"] <= 2.05


def test_a_map_scored_by_another_map_s_model_fits_nothing(tmp_path):
    small = sm.MapSpec(**{**SPEC.to_dict(), "sizes": ("s",), "lengths": (8,)})          # 2 cells, 10 rows
    first = sm.run_map(small, tmp_path / "a", "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=ENV,
                       progress=False, rates=RATES)
    model = sm.CostModel.load(first / sm.MODEL)
    assert model.fitted_in == first.name and model.calibrated_on == ("s",)
    spec = sm.MapSpec(**{**SPEC.to_dict(), "sizes": ("m",), "lengths": (12,), "batches": (1,), "calibrate": ()})
    second = sm.run_map(spec, tmp_path / "b", "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=ENV,
                        progress=False, rates=RATES, model=model)
    rows = read_jsonl(second / sm.ROWS)
    assert rows and not any(r["calibration"] for r in rows)
    for r in rows:
        assert r["predicted_p50_ms"] == pytest.approx(float(sm.features(r, RATES) @ np.asarray(model.coef)))
    assert f"in another map, `{first.name}`" in (second / sm.TABLE).read_text()
    assert sm.CostModel.load(second / sm.MODEL).coef == model.coef            # kept with the map it scored
    with pytest.raises(UserError, match="fits its own cost model on its calibration sizes or is scored by"):
        sm.run_map(SPEC, tmp_path / "c", "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=ENV,
                   progress=False, rates=RATES, model=model)
    assert not (tmp_path / "c").exists()                                       # refused before timing anything


def test_a_cost_model_file_that_does_not_fit_is_a_user_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot read a cost model from"):
        sm.CostModel.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({"coef": [0, 0, 0, 1.1, 0.8], "calibrated_on": ["small"],
                                                   "cells_fitted": 135}))
    with pytest.raises(UserError, match="has 5 coefficients but this cost model has 4 features"):
        sm.CostModel.load(tmp_path / "old.json")


def test_a_map_timed_on_a_gpu_names_the_device_and_sets_each_cell_beside_its_own_projection(tmp_path):
    """A GPU narbench states peaks for (its JAX device kind): every row names the device and its driver and
    carries the roofline projection on that device; the page compares measurement and projection and counts the
    speedups within 25%. --no-cost-model (cost_model=False) measures no machine rates and fits nothing."""
    spec = sm.MapSpec(sizes=("s",), lengths=(8,), batches=(1,), iterations=(1, 4), length_hyps=(1,), calibrate=(),
                      cell_seconds=0.05, min_calls=3, max_calls=4)
    env = {**ENV, "platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_driver": "driver 580.1; cuda 13"}
    run_dir = sm.run_map(spec, tmp_path, "narbench latency --map", factory=FakeFactory(), peaks=PEAKS, env=env,
                         progress=False, cost_model=False)
    rows = read_jsonl(run_dir / sm.ROWS)
    assert {(r["platform"], r["device_kind"], r["device_driver"], r["device_projection"]) for r in rows} == {
        ("gpu", "NVIDIA H100 80GB HBM3", "driver 580.1; cuda 13", "h100-sxm")}
    assert all(r["projection_h100-sxm_ms"] > 0 for r in rows)
    assert not (run_dir / sm.RATES).exists() and not (run_dir / sm.MODEL).exists()
    text = (run_dir / sm.TABLE).read_text()
    assert "Measured on **NVIDIA H100 80GB HBM3** (gpu, driver 580.1; cuda 13; host CPU Test CPU)" in text
    assert "## Measured on this device against its roofline projection" in text
    assert "projected speedup" in text and "None: this map fits no cost model" in text
    ar, t4 = (next(r for r in rows if r["system"] == name) for name in ("ar-greedy", "padir-T4-k1"))
    projected = ar["projection_h100-sxm_ms"] / t4["projection_h100-sxm_ms"]
    assert f"| {projected:.2f}x |" in text
    agree = sum(abs(r["speedup_p50_vs_ar"] / (ar["projection_h100-sxm_ms"] / r["projection_h100-sxm_ms"]) - 1) <= 0.25
                for r in rows if r["family"] != "ar")
    assert f"within ±25% of the projected speedup: **{agree} of 2**" in text


def test_a_cpu_map_has_no_device_projection():
    from bench.latency_map.cells import device_fields, projections

    assert device_fields(ENV)["device_projection"] is None
    assert device_fields({**ENV, "platform": "gpu", "device_kind": "NVIDIA H200"})["device_projection"] == "h200-sxm"
    assert projections(None) == sm.PROJECTED and projections("h100-sxm") == sm.PROJECTED
    assert projections("h200-sxm") == (*sm.PROJECTED, "h200-sxm")
