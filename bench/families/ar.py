"""The AR family: a causal T5 decoded greedily (the baseline of every speedup) or with beam search.

Spec section::

    [ar]
    decoders = ["greedy", "beam:5"]     # must include "greedy"
    length_penalty = 0.6                # beam search's GNMT alpha
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from bench import families
from bench.families.base import Context, Family, System, TrainCell
from narbench_core import defaults
from suites.spec import list_of, number, string

DECODER_RE = re.compile(r"^(greedy|beam:([1-9][0-9]*))$")


@dataclass(frozen=True)
class ARSection:
    decoders: tuple[str, ...] = ("greedy", f"beam:{defaults.BEAM_SIZE}")
    length_penalty: float = defaults.LENGTH_PENALTY


def system_name(decoder: str) -> str:
    return "ar-greedy" if decoder == "greedy" else f"ar-beam{decoder.split(':')[1]}"


class ARFamily(Family):
    name, label, paradigm, model_kind = "ar", "AR", "ar", "ar"
    required = True                                # the baseline of every suite
    baseline_system = system_name("greedy")

    def parse(self, table) -> ARSection:
        d = ARSection()
        section = ARSection(
            decoders=table.get("decoders", list_of(string(DECODER_RE, what='"greedy" or "beam:K"'),
                                                   '"greedy" or "beam:K" strings'), d.decoders),
            length_penalty=table.get("length_penalty", number(0.0), d.length_penalty))
        table.done()
        if "greedy" not in section.decoders:
            table.fail("decoders", 'must include "greedy" (the speedup baseline of every table)')
        return section

    def expand(self, section: ARSection, ctx: Context) -> list[System]:
        cell = TrainCell(ctx.task, self.name, ctx.seed)
        out = []
        for decoder in section.decoders:
            beam = 1 if decoder == "greedy" else int(decoder.split(":")[1])
            options = {**ctx.shapes, **({"length_penalty": section.length_penalty} if beam > 1 else {})}
            info = {"hypotheses": beam, "decoder": decoder, "variant": None}
            out.append(System(system_name(decoder), self.name, decoder, cell, tuple(sorted(options.items())),
                              tuple(info.items())))
        return out

    def point_label(self, row) -> str:
        return row.system.removeprefix("ar-")


families.register(ARFamily())
