"""bench.measure.timing: interleaving, phases, per-sentence attribution, warm-up kept apart (fake clock, exact)."""
from __future__ import annotations

import numpy as np
import pytest

from bench.measure import timing
from narbench_core.errors import UserError
from fakes import Costs, FakeClock, ScriptedDecoder

SOURCES = ["a b c", "d e", "f", "g h i j", "k l"]


def _systems(clock, log, **extra):
    return [
        ScriptedDecoder("A", clock, log, Costs(prepare=1_000, run=2_000, block=30_000, finish=500), **extra),
        ScriptedDecoder("B", clock, log, Costs(prepare=1_000, run=2_000, block=10_000, finish=500),
                        family="nar", fixed_passes=4, **extra),
        ScriptedDecoder("C", clock, log, Costs(prepare=2_000, run=1_000, block=5_000, finish=1_000),
                        family="nar", **extra),
    ]


def _run_order(log):
    return [name for event, name, _ in log if event == "run"]


def test_interleaved_without_rotation():
    clock, log = FakeClock(), []
    timing.measure(_systems(clock, log), SOURCES, rotate=False, clock=clock)
    assert _run_order(log) == ["A", "B", "C"] * len(SOURCES)


def test_rotation_cycles_the_order_per_batch():
    clock, log = FakeClock(), []
    m = timing.measure(_systems(clock, log), SOURCES, rotate=True, clock=clock)
    expected = ["A", "B", "C", "B", "C", "A", "C", "A", "B", "A", "B", "C", "B", "C", "A"]
    assert _run_order(log) == expected
    assert [name for _, _, name in m.schedule] == expected
    assert [b for _, b, _ in m.schedule] == [i // 3 for i in range(15)]



def test_turns_run_each_system_back_to_back_after_one_untimed_call():
    clock, log = FakeClock(), []
    m = timing.measure(_systems(clock, log), SOURCES, rotate=True, clock=clock, turn=2)
    # Turns of batches {0, 1}, {2, 3}, {4}; each system's turn starts with an untimed call on its first batch.
    runs = [(name, src) for event, name, src in log if event == "run"]
    assert [name for name, _ in runs] == (["A"] * 3 + ["B"] * 3 + ["C"] * 3 + ["B"] * 3 + ["C"] * 3 + ["A"] * 3
                                          + ["C"] * 2 + ["A"] * 2 + ["B"] * 2)
    assert [(b, name) for _, b, name in m.schedule] == [(0, "A"), (1, "A"), (0, "B"), (1, "B"), (0, "C"), (1, "C"),
                                                        (2, "B"), (3, "B"), (2, "C"), (3, "C"), (2, "A"), (3, "A"),
                                                        (4, "C"), (4, "A"), (4, "B")]
    assert m.turn == 2
    np.testing.assert_array_equal(m.latencies("A"), np.full(5, 0.0335))   # the untimed calls land nowhere
    assert m.systems["A"].hypotheses == ["c b a", "e d", "f", "j i h g", "l k"]
    with pytest.raises(UserError, match="turn"):
        timing.measure(_systems(clock, log), SOURCES, clock=clock, turn=0)


def test_solo_rounds_are_spread_through_the_schedule():
    clock, log = FakeClock(), []
    m = timing.measure_systems([timing.InProcess(d, clock) for d in _systems(clock, log)], SOURCES,
                               rotate=True, solo_batches=[0, 2, 4])
    runs = [name for event, name, _ in log if event == "run"]
    # Five turns of one batch; solo rounds (one sampled batch each) follow turns 0, 2 and 4. In a solo round
    # each system, in an order rotated per round, runs an untimed call and then its batch.
    assert runs == (["A", "B", "C"] + ["A", "A", "B", "B", "C", "C"]
                    + ["B", "C", "A"] + ["C", "A", "B"] + ["B", "B", "C", "C", "A", "A"]
                    + ["A", "B", "C"] + ["B", "C", "A"] + ["C", "C", "A", "A", "B", "B"])
    assert [name for _, _, name in m.schedule] == ["A", "B", "C", "B", "C", "A", "C", "A", "B", "A", "B", "C",
                                                   "B", "C", "A"]                 # solo rounds are not in it
    for t in m.systems.values():
        assert np.isnan(t.solo_ms).tolist() == [False, True, False, True, False]
    np.testing.assert_array_equal(m.systems["A"].solo_ms[[0, 2, 4]], np.full(3, 0.0335))
    # With turns of two batches the sample is cut into chunks of two: rounds [0, 2] and [4].
    log.clear()
    timing.measure_systems([timing.InProcess(d, clock) for d in _systems(clock, log)], SOURCES,
                           rotate=False, solo_batches=[0, 2, 4], turn=2)
    runs = [name for event, name, _ in log if event == "run"]
    assert runs[9:18] == ["A"] * 3 + ["B"] * 3 + ["C"] * 3                  # after turn 0 (9 runs): [0, 2]
    assert runs[-6:] == ["A", "A", "B", "B", "C", "C"]                       # after the last turn: [4]


def test_phases_sum_the_right_parts_and_block_is_called():
    clock, log = FakeClock(), []
    systems = _systems(clock, log)
    e2e = timing.measure(systems, SOURCES, phase="end_to_end", clock=clock)
    np.testing.assert_array_equal(e2e.latencies("A"), np.full(5, 0.0335))  # ms: 1+2+30+0.5 us
    np.testing.assert_array_equal(e2e.latencies("B"), np.full(5, 0.0135))
    np.testing.assert_array_equal(e2e.latencies("C"), np.full(5, 0.009))
    dev = timing.measure(systems, SOURCES, phase="device", clock=clock)
    np.testing.assert_array_equal(dev.latencies("A"), np.full(5, 0.032))   # run + block only
    np.testing.assert_array_equal(dev.latencies("C"), np.full(5, 0.006))
    # Every run was followed by its block before finish (ScriptedDecoder.finish also checks it).
    events = [(e, n) for e, n, _ in log]
    for i, (event, name) in enumerate(events):
        if event == "run":
            assert events[i + 1] == ("block", name) and events[i + 2] == ("finish", name)


def test_batch_time_is_attributed_to_each_sentence():
    clock, log = FakeClock(), []
    a = ScriptedDecoder("A", clock, log, Costs(run=1_000_000))
    m = timing.measure([a], SOURCES, batch_size=2, clock=clock)
    assert [n for e, _, n in log if e == "run"] == [2, 2, 1]
    np.testing.assert_array_equal(m.latencies("A"), np.full(5, 1.0))
    assert m.systems["A"].hypotheses == ["c b a", "e d", "f", "j i h g", "l k"]
    np.testing.assert_array_equal(m.systems["A"].passes, [3, 2, 1, 4, 2])
    assert m.batch_size == 2 and m.phase == "end_to_end"


def test_per_sentence_latencies_follow_their_batch():
    clock, log = FakeClock(), []

    class Growing(ScriptedDecoder):
        def run(self, prepared):  # cost grows with the batch's longest sentence
            self.clock.advance(1_000_000 * max(len(s.split()) for s in prepared.sources))
            return super().run(prepared)

    m = timing.measure([Growing("G", clock, log)], SOURCES, batch_size=1, clock=clock)
    np.testing.assert_array_equal(m.latencies("G"), [3.0, 2.0, 1.0, 4.0, 2.0])


def test_repeats_keep_raw_and_take_the_median():
    clock, log = FakeClock(), []
    calls = []

    class Jittery(ScriptedDecoder):
        def run(self, prepared):
            calls.append(1)
            self.clock.advance([1, 5, 2][(len(calls) - 1) // len(SOURCES)] * 1_000_000)
            return super().run(prepared)

    m = timing.measure([Jittery("J", clock, log)], SOURCES, repeats=3, clock=clock)
    assert m.systems["J"].raw_ms.shape == (3, 5)
    np.testing.assert_array_equal(m.systems["J"].raw_ms[:, 0], [1.0, 5.0, 2.0])
    np.testing.assert_array_equal(m.latencies("J"), np.full(5, 2.0))


def test_warmup_compiles_every_bucket_and_stays_out_of_measurement():
    clock, log = FakeClock(), []
    systems = _systems(clock, log, warmup_costs=7_000_000_000)  # 7 s "compile" per bucket
    compile_s = timing.warmup(systems, batch_size=1, clock=clock)
    # 2 buckets x (7 s compile + run + block + finish)
    assert compile_s["A"] == pytest.approx(2 * (7 + 32.5e-6))
    assert set(compile_s) == {"A", "B", "C"}
    assert [n for e, name, n in log if e == "run" and name == "A"] == [1, 1]
    m = timing.measure(systems, SOURCES, clock=clock)
    assert m.latencies("A").max() == pytest.approx(0.0335)  # no compile inside the measured rounds


def test_bad_arguments_give_user_errors():
    clock, log = FakeClock(), []
    systems = _systems(clock, log)
    with pytest.raises(UserError, match="phase"):
        timing.measure(systems, SOURCES, phase="wall", clock=clock)
    with pytest.raises(UserError, match="batch size"):
        timing.measure(systems, SOURCES, batch_size=0, clock=clock)
    with pytest.raises(UserError, match="duplicate"):
        timing.measure([systems[0], systems[0]], SOURCES, clock=clock)
    with pytest.raises(UserError, match="empty"):
        timing.measure(systems, [], clock=clock)
    with pytest.raises(UserError, match="platform"):
        timing.resolve_platform("no-such-platform")


def test_platform_is_recorded():
    clock, log = FakeClock(), []
    m = timing.measure(_systems(clock, log)[:1], SOURCES[:1], clock=clock)
    assert m.platform == timing.default_platform() == "cpu"
    assert timing.resolve_platform(None) == "cpu" and timing.resolve_platform("cpu") == "cpu"


def test_real_jitted_decoders_through_the_protocol(jitted_pair):
    jitted = jitted_pair
    compile_s = timing.warmup(jitted, batch_size=1)
    assert all(v > 0 for v in compile_s.values())
    m = timing.measure(jitted, ["a b c", "d e f g h i j k l m", "x"], phase="end_to_end")
    for d in jitted:
        lat = m.latencies(d.name)
        assert lat.shape == (3,) and np.all(lat > 0)
        assert [len(h.split()) for h in m.systems[d.name].hypotheses] == [3, 10, 1]
        np.testing.assert_array_equal(m.systems[d.name].passes, [d.passes] * 3)


def test_gc_is_paused_only_inside_the_timed_window():
    import gc

    clock, log, seen = FakeClock(), [], []

    class Probe(ScriptedDecoder):
        def prepare(self, sources):
            seen.append(("prepare", gc.isenabled()))
            return super().prepare(sources)

        def run(self, prepared):
            seen.append(("run", gc.isenabled()))
            return super().run(prepared)

    assert gc.isenabled()
    timing.measure([Probe("P", clock, log)], SOURCES[:1], phase="device", clock=clock)
    timing.measure([Probe("P", clock, log)], SOURCES[:1], phase="end_to_end", clock=clock)
    assert seen == [("prepare", True), ("run", False), ("prepare", False), ("run", False)]
    assert gc.isenabled()


def test_phases_of_each_call_add_up_to_its_latency():
    clock, log = FakeClock(), []
    a = ScriptedDecoder("A", clock, log, Costs(prepare=1_000_000, encode=2_000_000, run=3_000_000, block=4_000_000,
                                               finish=5_000_000))
    b = ScriptedDecoder("B", clock, log, Costs(prepare=500_000, run=1_000_000, block=250_000, finish=250_000))
    m = timing.measure([a, b], SOURCES, batch_size=2, clock=clock)
    ta, tb = m.systems["A"], m.systems["B"]
    assert ta.phase_ms == [{"tokenize": 1.0, "encode": 2.0, "passes": 7.0, "detokenize": 5.0}] * 5
    assert tb.phase_ms == [{"tokenize": 0.5, "passes": 1.25, "detokenize": 0.25}] * 5   # marks no encode
    np.testing.assert_array_equal(ta.host_syncs, [2] * 5)     # its encoder's end and the timer's wait
    np.testing.assert_array_equal(tb.host_syncs, [1] * 5)
    for t in (ta, tb):
        np.testing.assert_allclose([sum(d.values()) for d in t.phase_ms], t.latencies_ms, rtol=1e-12)
    dev = timing.measure([a], SOURCES, phase="device", clock=clock)     # the window is run + block only
    assert dev.systems["A"].phase_ms[0] == {"encode": 2.0, "passes": 7.0}


def test_phases_come_from_the_median_repeat():
    clock, log = FakeClock(), []

    class Slower(ScriptedDecoder):          # each repeat slower than the last in its passes
        def run(self, prepared):
            self.costs.run += 1_000_000
            return super().run(prepared)

    a = Slower("A", clock, log, Costs(prepare=1_000_000, run=0))
    m = timing.measure([a], SOURCES[:1], repeats=3, clock=clock)
    t = m.systems["A"]
    np.testing.assert_array_equal(t.raw_ms[:, 0], [2.0, 3.0, 4.0])
    assert t.latencies_ms[0] == 3.0 and t.phase_ms[0] == {"tokenize": 1.0, "passes": 2.0, "detokenize": 0.0}


def test_phase_p50s_add_up_to_the_latency_p50_within_five_percent():
    from bench.rows import compute_figures

    clock, log = FakeClock(), []

    class Growing(ScriptedDecoder):          # every phase grows with the sentence, as real ones do
        def prepare(self, sources):
            self.clock.advance(100_000 * len(sources[0].split()))
            return super().prepare(sources)

        def run(self, prepared):
            self.clock.advance(1_000_000 * len(prepared.sources[0].split()))
            return super().run(prepared)

    a = Growing("A", clock, log, Costs(prepare=50_000, encode=300_000, run=200_000, block=100_000, finish=20_000))
    sources = [" ".join("w" * (1 + i % 7) for _ in range(1 + i % 9)) for i in range(40)]
    t = timing.measure([a], sources, clock=clock).systems["A"]
    out = compute_figures(t.hypotheses, [sources], t.latencies_ms, t.passes, "en", score=False,
                  phase_ms=t.phase_ms, host_syncs=list(t.host_syncs))
    assert set(out["phase_p50_ms"]) == {"tokenize", "encode", "passes", "detokenize"}
    assert out["phase_p50_sum_ratio"] == pytest.approx(1.0, abs=0.05)
    assert out["host_syncs"] == 2.0


def test_on_batch_reports_progress_between_timed_windows():
    clock, log = FakeClock(), []
    a = ScriptedDecoder("A", clock, log, Costs(run=1_000))
    seen = []

    def on_batch(done, total):
        seen.append((done, total, len(log)))          # called after the batch's prepare/run/block/finish

    timing.measure([a], SOURCES, batch_size=2, repeats=2, clock=clock, on_batch=on_batch)
    assert [(d, t) for d, t, _ in seen] == [(2, 10), (4, 10), (5, 10), (7, 10), (9, 10), (10, 10)]
    assert [n for _, _, n in seen] == [4 * i for i in range(1, 7)]
