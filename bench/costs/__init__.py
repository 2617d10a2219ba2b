"""Cost model: what a decoder's work costs and what the hardware allows, in three rooms.

- ``bench.costs.xla``: XLA flops, bytes, kernels, batched dots and layout moves of a decoder's batches
  (``xla_cost``, ``loop_costs``, ``decoder_cost``, ``cost_of``) and the roofline bound (``roofline_ms``,
  ``roofline_share``);
- ``bench.costs.machine``: this machine's measured peaks (``machine_peaks``, cached per machine key) and
  in-loop rates (``measure_rates``, ``measure_dot_rates``, ``measure_move_rates``), all by one protocol;
- ``bench.costs.accelerators``: roofline projections from published accelerator peaks (``project``),
  always labelled ``PROJECTION_LABEL`` and never mixed into measured columns.

The names other packages use are re-exported here (``from bench import costs``; ``costs.X``).
"""
from bench.costs.accelerators import (ACCELERATORS, PROJECTION_LABEL, Accelerator, Projection, accelerator, for_device,
                                     project)
from bench.costs.machine import (GEMM_ROWS, MOVE_BYTES, STREAM_BYTES, MachinePeaks, MachineRates, machine_key,
                                 machine_peaks, measure_dot_rates, measure_move_rates, measure_peaks, measure_rates)
from bench.costs.xla import (DecoderCost, XlaCost, cost_of, decoder_cost, entry_ops, hlo_work, loop_costs,
                             roofline_ms, roofline_share, xla_cost)

__all__ = [
    "ACCELERATORS", "PROJECTION_LABEL", "Accelerator", "Projection", "accelerator", "for_device", "project",
    "GEMM_ROWS", "MOVE_BYTES", "STREAM_BYTES", "MachinePeaks", "MachineRates", "machine_key", "machine_peaks",
    "measure_dot_rates", "measure_move_rates", "measure_peaks", "measure_rates",
    "DecoderCost", "XlaCost", "cost_of", "decoder_cost", "entry_ops", "hlo_work", "loop_costs", "roofline_ms",
    "roofline_share", "xla_cost",
]
