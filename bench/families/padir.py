"""The PaDIR family: a bidirectional refiner decoding T parallel passes over k length hypotheses.

Spec section (each key is an axis; the systems are the Cartesian product)::

    [padir]
    iterations = [1, 2, 4, 10]     # refinement iterations T (decoding; at most T decoder passes)
    length_hyps = [5]              # length hypotheses k (decoding)
    length_bonus = [0]             # tokens added to every predicted length (decoding; set on dev)
    remask = ["stutter"]           # none | stutter | mask-predict (decoding)
    start = ["random"]             # initial hypothesis: random | mask (decoding)
    unmask_rate = [0.15]           # training noise: share of target tokens kept correct
    stages = [2]                   # training stages
    positional_attention = [true]  # the positional-attention sublayer (model)
    distill = [false, true]        # train on the AR teacher's outputs
    init = ["random"]              # parameters: random, or "ar": warm-started from the suite's AR model
    recipe = ["reference"]         # "reference": fixed EOS, [LENGTH] query, stage-2 remasking
                                   # (google-research padir/); "plain": without them
    glancing = [false]             # glancing training (GLAT): reveal a share of a no-gradient pass's errors
    length_predictor = ["absolute"]  # length classes: absolute lengths (the paper), or offsets from the
                                   # source length (fairseq's NAT models)
    exclude = [{distill = false, length_hyps = 1}]   # combinations left out of the product: each
                                   # table drops every system that has all of its values (a list
                                   # value matches any of its items: {length_hyps = 5, iterations = [1, 2]})

A system is named ``padir-s{T}-u{rate}[-distill]`` plus a suffix for every axis that differs from
the paper's default (``-k3``, ``-lb2``, ``-remask-none``, ``-start-mask``, ``-nopos``, ``-st1``, ``-init-ar``,
``-recipe-plain``, ``-glat``, ``-lenoff``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Any

from bench import families
from bench.families.base import Context, Family, System, TrainCell
from bench.columns import Column, fixed
from narbench_core import defaults as d
from suites.spec import Invalid, boolean, integer, list_of, number, string


@dataclass(frozen=True)
class PaDIRSection:
    iterations: tuple[int, ...] = (1, 2, 4, 10)
    unmask_rate: tuple[float, ...] = (d.UNMASK_RATE,)
    distill: tuple[bool, ...] = (False, True)
    length_hyps: tuple[int, ...] = (d.LENGTH_HYPS,)
    length_bonus: tuple[int, ...] = (d.LENGTH_BONUS,)
    remask: tuple[str, ...] = (d.REMASK,)
    start: tuple[str, ...] = (d.START,)
    positional_attention: tuple[bool, ...] = (d.POSITIONAL_ATTENTION,)
    stages: tuple[int, ...] = (d.STAGES,)
    init: tuple[str, ...] = (d.INIT,)
    recipe: tuple[str, ...] = (d.RECIPE,)
    glancing: tuple[bool, ...] = (d.GLANCING,)
    length_predictor: tuple[str, ...] = (d.LENGTH_PREDICTOR,)
    exclude: tuple[dict[str, Any], ...] | None = None    # None, not (): suites without it keep their hash

    def excluded(self, values: dict[str, Any]) -> bool:
        """Does one of the ``exclude`` tables match these axis values? (A list value: any of its items.)"""
        return any(all(values[k] in _any_of(v) for k, v in rule.items()) for rule in self.exclude or ())


def _any_of(value: Any) -> list:
    """An ``exclude`` value as the list of values it matches."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


AXES = tuple(f.name for f in fields(PaDIRSection) if f.name != "exclude")


def _exclusions(section: PaDIRSection):
    """The check of ``exclude``: a list of tables, each naming axes of the section with a value of the
    axis's type or a non-empty list of them. A value the axis does not list matches nothing (a suite
    that ``extends`` another may narrow an axis its parent's rules name)."""
    def check(value):
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) and v for v in value):
            raise Invalid(f"expected a non-empty list of tables such as {{distill = false, length_hyps = 1}}, "
                          f"got {value!r}")
        for rule in value:
            for key, v in rule.items():
                if key not in AXES:
                    raise Invalid(f"{key!r} is not an axis of [padir] (axes: {', '.join(AXES)})")
                kind = type(getattr(section, key)[0])
                if (isinstance(v, list) and not v) or any(type(x) is not kind and not (kind is float and type(x) is int)
                                                          for x in _any_of(v)):
                    raise Invalid(f"{key} = {v!r}: expected a {kind.__name__} like the section's {key} values "
                                  f"{list(getattr(section, key))}, or a non-empty list of them")
        return tuple(dict(rule) for rule in value)
    return check


def _suffix(length_hyps: int, remask: str, start: str, positional_attention: bool, stages: int, init: str,
            recipe: str, glancing: bool = d.GLANCING, length_predictor: str = d.LENGTH_PREDICTOR,
            length_bonus: int = d.LENGTH_BONUS) -> str:
    """One name part per axis that differs from the paper's default."""
    return ((f"-k{length_hyps}" if length_hyps != d.LENGTH_HYPS else "")
            + (f"-lb{length_bonus}" if length_bonus != d.LENGTH_BONUS else "")
            + (f"-remask-{remask}" if remask != d.REMASK else "")
            + (f"-start-{start}" if start != d.START else "")
            + ("" if positional_attention else "-nopos")
            + (f"-st{stages}" if stages != d.STAGES else "")
            + (f"-init-{init}" if init != d.INIT else "")
            + (f"-recipe-{recipe}" if recipe != d.RECIPE else "")
            + (("-glat" if glancing else "-noglat") if glancing != d.GLANCING else "")
            + ({"offset": "-lenoff", "absolute": "-lenabs"}[length_predictor]
               if length_predictor != d.LENGTH_PREDICTOR else ""))


class PaDIRFamily(Family):
    name, label, paradigm, model_kind = "padir", "PaDIR", "nar", "padir"
    columns = (
        Column("iterations", "T", doc="refinement iterations T: at most T decoder passes (a row stops early "
                                     "once an iteration changes none of its tokens)"),
        Column("unmask_rate", "unmask rate", fixed(2)),
        Column("length_hyps", "k", doc="length hypotheses"),
        Column("length_bonus", "len +", optional=True, doc="tokens added to every predicted length"),
        Column("remask"), Column("start", doc="initial hypothesis: random | mask"),
        Column("positional_attention"), Column("stages"),
        Column("init", "init", align="left", doc="parameters: random, or warm-started from the AR model"),
        Column("recipe", align="left",
               doc="reference (fixed EOS, [LENGTH] query, stage-2 remasking) or plain (none of them)"),
        Column("glancing", doc="glancing training (GLAT)", optional=True),
        Column("length_predictor", "length classes", align="left", optional=True,
               doc="absolute lengths, or offsets from the source length"),
    )

    def parse(self, table) -> PaDIRSection:
        s = PaDIRSection()
        positive = list_of(integer(1), "positive integers")
        flags = list_of(boolean, "true/false")
        if table.get("steps", lambda v: v, None) is not None:
            table.fail("steps", "renamed: write the refinement iterations T as `iterations`")
        section = PaDIRSection(
            iterations=table.get("iterations", positive, s.iterations),
            unmask_rate=table.get("unmask_rate", list_of(number(0.0, 1.0), "numbers in [0, 1]"), s.unmask_rate),
            distill=table.get("distill", flags, s.distill),
            length_hyps=table.get("length_hyps", positive, s.length_hyps),
            length_bonus=table.get("length_bonus", list_of(integer(-64), "whole numbers of tokens (at least -64)"),
                                   s.length_bonus),
            remask=table.get("remask", list_of(string(choices=d.REMASK_MODES), f"one of {', '.join(d.REMASK_MODES)}"),
                             s.remask),
            start=table.get("start", list_of(string(choices=d.START_MODES), f"one of {', '.join(d.START_MODES)}"),
                           s.start),
            positional_attention=table.get("positional_attention", flags, s.positional_attention),
            stages=table.get("stages", positive, s.stages),
            init=table.get("init", list_of(string(choices=d.INIT_MODES), f"one of {', '.join(d.INIT_MODES)}"), s.init),
            recipe=table.get("recipe", list_of(string(choices=d.RECIPES), f"one of {', '.join(d.RECIPES)}"),
                             s.recipe),
            glancing=table.get("glancing", flags, s.glancing),
            length_predictor=table.get("length_predictor", list_of(
                string(choices=d.LENGTH_PREDICTORS), f"one of {', '.join(d.LENGTH_PREDICTORS)}"), s.length_predictor),
        )
        section = replace(section, exclude=table.get("exclude", _exclusions(section), None))
        table.done()
        combos = (dict(zip(AXES, values)) for values in itertools.product(*(getattr(section, a) for a in AXES)))
        if section.exclude and all(section.excluded(c) for c in combos):
            table.fail("exclude", "the rules exclude every system of the section")
        return section

    def expand(self, section: PaDIRSection, ctx: Context) -> list[System]:
        out = []
        for rate, distill, pos, stages, init, recipe, glancing, length in itertools.product(
                section.unmask_rate, section.distill, section.positional_attention, section.stages, section.init,
                section.recipe, section.glancing, section.length_predictor):
            axes = (("positional_attention", pos), ("recipe", recipe), ("stages", stages), ("unmask_rate", rate))
            if glancing != d.GLANCING:            # cells without these axes keep their labels
                axes = (("glancing", glancing),) + axes
            if length != d.LENGTH_PREDICTOR:
                axes = (("length_predictor", length),) + axes
            cell = TrainCell(ctx.task, self.name, ctx.seed, axes, ctx.teacher if distill else None,
                             ctx.teacher if init == "ar" else None)
            for iterations, k, bonus, remask, start in itertools.product(
                    section.iterations, section.length_hyps, section.length_bonus, section.remask, section.start):
                if section.excluded(dict(
                        iterations=iterations, unmask_rate=rate, distill=distill, length_hyps=k, length_bonus=bonus,
                        remask=remask, start=start, positional_attention=pos, stages=stages, init=init,
                        recipe=recipe, glancing=glancing, length_predictor=length)):
                    continue
                variant = (f"padir-u{rate:g}" + ("-distill" if distill else "")
                           + _suffix(k, remask, start, pos, stages, init, recipe, glancing, length, bonus))
                name = variant.replace("padir-", f"padir-s{iterations}-", 1)
                options = {**ctx.shapes, "length_hyps": k, "remask": remask, "start": start, "seed": ctx.seed,
                           "length_bonus": bonus}
                info = {"iterations": iterations, "unmask_rate": rate, "length_hyps": k, "hypotheses": k,
                        "length_bonus": bonus, "remask": remask,
                        "start": start, "positional_attention": pos, "stages": stages, "init": init,
                        "recipe": recipe, "glancing": glancing, "length_predictor": length,
                        "decoder": f"refine:{iterations}", "variant": variant}
                out.append(System(name, self.name, f"refine:{iterations}", cell, tuple(sorted(options.items())),
                                  tuple(info.items())))
        return out

    def axes_configs(self, axes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        reference = axes.pop("recipe", d.RECIPE) == "reference"
        return ({"positional_attention": axes.pop("positional_attention", d.POSITIONAL_ATTENTION),
                 "fixed_eos": reference, "length_token": reference,
                 "length_offset": axes.pop("length_predictor", d.LENGTH_PREDICTOR) == "offset"},
                {"unmask_rate": axes.pop("unmask_rate", d.UNMASK_RATE), "stages": axes.pop("stages", d.STAGES),
                 "stage_remask": reference, "glancing": axes.pop("glancing", d.GLANCING)})

    def sort_key(self, row) -> tuple:
        return (row.distill, row.unmask_rate, row.iterations, row.system)

    def point_label(self, row) -> str:
        rate = "" if row.unmask_rate == d.UNMASK_RATE else f" u{row.unmask_rate:g}"
        rest = _suffix(row.length_hyps, row.remask, row.start, row.positional_attention, row.stages, row.init,
                       row.recipe, bool(row.glancing), row.length_predictor or d.LENGTH_PREDICTOR,
                       row.length_bonus or d.LENGTH_BONUS)
        return f"T={row.iterations}{rate}{rest.replace('-', ' ')}"

    def name_parts(self, row) -> list[tuple[str, str, bool]]:
        def part(axis: str, text) -> tuple[str, str, bool]:    # rows from before an axis existed hold None
            value = row[axis]
            return axis, "" if value is None else text(value), axis == "iterations"

        return [part("iterations", lambda v: f"T={v}"),
                part("length_hyps", lambda v: f"k={v}"),
                part("unmask_rate", lambda v: f"u={v:g}"),
                part("length_bonus", lambda v: f"len{v:+d}"),
                part("distill", lambda v: ", distilled" if v else ", raw"),
                part("glancing", lambda v: ", glancing" if v else ", no glancing"),
                part("remask", lambda v: f", remask {v}"),
                part("start", lambda v: f", {v} start"),
                part("init", lambda v: ", from AR" if v == "ar" else f", {v} init"),
                part("recipe", lambda v: f", {v} recipe"),
                part("length_predictor", lambda v: ", length offsets" if v == "offset" else ", absolute lengths"),
                part("positional_attention", lambda v: "" if v else ", no positional attention"),
                part("stages", lambda v: f", {v} stage{'s' * (v != 1)}")]

    def style(self, row) -> dict[str, Any]:
        if row.distill:
            return {"color": "#c0392b", "marker": "o", "label": "PaDIR, distilled"}
        return {"color": "#e67e22", "marker": "o", "label": "PaDIR (T = iterations)"}


families.register(PaDIRFamily())
