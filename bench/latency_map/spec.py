"""What a latency map measures: its settings (:class:`MapSpec`, whose hash names the run folder),
its cells (size, target length, batch size) and its systems (AR greedy and PaDIR ``refine:T`` with
``k`` length hypotheses), and the names of the files a map folder holds."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from narbench_core.digest import COMPACT, json_digest
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl

SUITE = "speedmap"                 # results/<SUITE>/<run_id>/
ROWS = "rows.jsonl"
TABLE = "speedmap.md"
PLOT = "crossover.png"
RATES = "machine_rates.json"
MODEL = "cost_model.json"
AR_NAME = "ar-greedy"
PROJECTED = ("tpu-v3", "a100-sxm-80gb", "h100-sxm")      # accelerators the report projects onto
RENAMED = {"steps": "iterations", "hyps": "length_hyps"}  # names in maps written before the rename -> now


def read_rows(path) -> list[dict]:
    """A map's ``rows.jsonl`` (rows written before a column was renamed read under the new name)."""
    return [{RENAMED.get(k, k): v for k, v in row.items()} for row in read_jsonl(path)]


@dataclass(frozen=True)
class MapSpec:
    """What one map measures (its hash names the run folder, so the same settings resume)."""

    sizes: tuple[str, ...] = ("small", "paper")
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256)
    batches: tuple[int, ...] = (1, 8, 32)
    iterations: tuple[int, ...] = (1, 2, 4, 10)   # PaDIR's refinement iterations T
    length_hyps: tuple[int, ...] = (1, 5)         # PaDIR's length hypotheses k
    calibrate: tuple[str, ...] = ("small",)   # sizes the cost model is fitted on
    vocab_size: int = 8000
    cell_seconds: float = 30.0                # timed seconds per cell (all systems), before clipping
    min_calls: int = 3
    max_calls: int = 50
    seed: int = 0

    def __post_init__(self):
        for name in ("sizes", "lengths", "batches", "iterations", "length_hyps"):
            if not getattr(self, name):
                raise UserError(f"the map needs at least one value of {name}")
        for name in ("lengths", "batches", "iterations", "length_hyps"):
            bad = [v for v in getattr(self, name) if int(v) != v or v < 1]
            if bad:
                raise UserError(f"{name} must be whole numbers >= 1, got {bad}")
        if not set(self.calibrate) <= set(self.sizes):
            raise UserError(f"calibration sizes {sorted(set(self.calibrate) - set(self.sizes))} are not among "
                            f"the map's sizes {list(self.sizes)}; pass --calibrate with one of them")
        if not 1 <= self.min_calls <= self.max_calls:
            raise UserError(f"need 1 <= min_calls <= max_calls, got {self.min_calls} and {self.max_calls}")
        if not self.cell_seconds > 0:
            raise UserError(f"cell_seconds must be > 0, got {self.cell_seconds}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MapSpec":
        """A spec as ``to_dict`` wrote it (maps written before a field was renamed included)."""
        values = {RENAMED.get(k, k): v for k, v in data.items()}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def spec_hash(self) -> str:
        return json_digest(self.to_dict(), separators=COMPACT)

    def to_toml(self) -> str:
        from suites.spec import dump_toml

        return dump_toml(self.to_dict())

    def cells(self) -> list["Cell"]:
        """Every (size, length, batch), cheapest first: by tokens per call, then size as listed, then
        length; sizes interleave, so an unfinished map already holds cells of every size (the cost
        model's calibration and its held-out sizes)."""
        out = [Cell(s, int(n), int(b)) for s in self.sizes for n in self.lengths for b in self.batches]
        return sorted(out, key=lambda c: (c.length * c.batch, self.sizes.index(c.size), c.length))

    def systems(self) -> list["MapSystem"]:
        return [MapSystem(AR_NAME, "greedy", 0, 1)] + [
            MapSystem(f"padir-T{t}-k{k}", f"refine:{t}", int(t), int(k))
            for k in self.length_hyps for t in self.iterations]


@dataclass(frozen=True)
class Cell:
    size: str
    length: int      # source tokens = forced target tokens
    batch: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.size, self.length, self.batch)


@dataclass(frozen=True)
class MapSystem:
    name: str
    spec: str        # decoder spec: greedy | refine:T
    iterations: int  # T (0 for AR)
    length_hyps: int

    @property
    def kind(self) -> str:
        """The model kind the system runs on (models.config.ModelConfig.kind): its rows' family."""
        return "ar" if self.iterations == 0 else "padir"

    def tokens_per_pass(self, length: int) -> int:
        """Target positions one decoder pass computes per hypothesis: one AR step, or all of them."""
        return 1 if self.iterations == 0 else int(length)
