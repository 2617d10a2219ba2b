"""The AR family: a causal T5 decoded greedily (the baseline of every speedup) or with beam search.

Spec section::

    [ar]
    decoders = ["greedy", "beam:5"]     # must include "greedy"
    length_penalty = 0.6                # beam search's GNMT alpha
    layers = ["6-1"]                    # more AR models with these "ENCODER-DECODER" layer counts (a deep
                                        # encoder and shallow decoder, Kasai et al. 2021), same budget; default none
    layers_distill = [false, true]      # those models trained on the references, on the distilled set, or both

The suite's own model (the preset's layers) is the baseline, the distillation teacher and the warm-start
source. Another layout's systems are named ``ar-6x1-greedy``, ``ar-6x1-distill-beam5`` ...
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bench import families
from bench.families.base import Context, Family, System, TrainCell, search_words
from bench.columns import Column
from narbench_core import defaults
from narbench_core.errors import UserError
from suites.spec import boolean, list_of, number, string

DECODER_RE = re.compile(r"^(greedy|beam:([1-9][0-9]*))$")
LAYERS_RE = re.compile(r"^([1-9][0-9]*)-([1-9][0-9]*)$")


@dataclass(frozen=True)
class ARSection:
    decoders: tuple[str, ...] = ("greedy", f"beam:{defaults.BEAM_SIZE}")
    length_penalty: float = defaults.LENGTH_PENALTY
    layers: tuple[str, ...] = ()
    layers_distill: tuple[bool, ...] = (False,)


def system_name(decoder: str, layers: str | None = None, distill: bool = False) -> str:
    """``ar-greedy``, ``ar-beam5``; another layout: ``ar-6x1-greedy``, ``ar-6x1-distill-beam5``."""
    search = "greedy" if decoder == "greedy" else f"beam{decoder.split(':')[1]}"
    layout = f"{layers.replace('-', 'x')}-{'distill-' if distill else ''}" if layers else ""
    return f"ar-{layout}{search}"


class ARFamily(Family):
    name, label, paradigm, model_kind = "ar", "AR", "ar", "ar"
    shares_worker = True           # JAX decoders: one XLA runtime, models' parameters passed as arguments
    required = True                                # the baseline of every suite
    baseline_system = system_name("greedy")
    columns = (Column("layers", align="left", optional=True,
                      doc="encoder-decoder layers of another AR layout (empty: the suite's model)"),)

    def parse(self, table) -> ARSection:
        d = ARSection()
        section = ARSection(
            decoders=table.get("decoders", list_of(string(DECODER_RE, what='"greedy" or "beam:K"'),
                                                   '"greedy" or "beam:K" strings'), d.decoders),
            length_penalty=table.get("length_penalty", number(0.0), d.length_penalty),
            layers=table.get("layers", list_of(string(LAYERS_RE, what='"ENCODER-DECODER" layer counts such as "6-1"'),
                                               '"ENCODER-DECODER" strings', empty=True), d.layers),
            layers_distill=table.get("layers_distill", list_of(boolean, "true/false"), d.layers_distill))
        table.done()
        if "greedy" not in section.decoders:
            table.fail("decoders", 'must include "greedy" (the speedup baseline of every table)')
        return section

    def expand(self, section: ARSection, ctx: Context) -> list[System]:
        base = TrainCell(ctx.task, self.name, ctx.seed)
        models = [(base, None, False)] + [
            (TrainCell(ctx.task, self.name, ctx.seed, (("layers", layers),), ctx.teacher if distill else None),
             layers, distill) for layers in section.layers for distill in section.layers_distill]
        out = []
        for cell, layers, distill in models:
            for decoder in section.decoders:
                beam = 1 if decoder == "greedy" else int(decoder.split(":")[1])
                options = {**ctx.shapes, **({"length_penalty": section.length_penalty} if beam > 1 else {})}
                info = {"hypotheses": beam, "decoder": decoder, "variant": None, "layers": layers}
                out.append(System(system_name(decoder, layers, distill), self.name, decoder, cell,
                                  tuple(sorted(options.items())), tuple(info.items())))
        return out

    def axes_configs(self, axes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        layers = axes.pop("layers", None)
        if axes:
            raise UserError(f"{sorted(axes)} do not apply to AR models; drop them")
        if layers is None:
            return {}, {}
        encoder, decoder = (int(x) for x in LAYERS_RE.match(layers).groups())
        return {"num_encoder_layers": encoder, "num_decoder_layers": decoder}, {}

    def model_axes(self, row) -> dict[str, Any]:
        return {"layers": row.get("layers")} if row.get("layers") else {}

    def sort_key(self, row) -> tuple:
        return (row.layers or "", bool(row.distill), row.hypotheses, row.system)

    def point_label(self, row) -> str:
        return row.system.removeprefix("ar-")

    def name_parts(self, row) -> list[tuple[str, str, bool]]:
        return [("decoder", search_words(row.decoder or ""), True),
                ("layers", f", {row.layers} layers" if row.layers else "", False),
                ("distill", ", distilled" if row.distill else "", False)]


families.register(ARFamily())
