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
    glance_start = [0.5]           # with glancing: the glancing ratio at step 0 ...
    glance_end = [0.3]             # ... annealed linearly to this at the last step
    length_predictor = ["absolute"]  # length classes: absolute lengths (the paper), or offsets from the
                                   # source length (fairseq's NAT models)
    exclude = [{distill = false, length_hyps = 1}]   # combinations left out of the product: each
                                   # table drops every system that has all of its values (a list
                                   # value matches any of its items: {length_hyps = 5, iterations = [1, 2]})

Only axes that act are swept: an axis that a setting silences (``SILENCED_BY``: ``unmask_rate`` with
``glancing = true``, the glancing ratios without it, ``remask`` at ``iterations = 1``) would give
identical systems under different names, so a section that sweeps one there (two of its values in
systems that differ in nothing else, after ``exclude``) is refused in one line naming the axis and the
setting, and so is a value other than the default that acts in no system. Names, rows and training
cells carry only the axes that act (a silenced axis's column is None).

A system is named ``padir-s{T}[-u{rate}][-distill]`` (the rate where it acts) plus a suffix for every
live axis that differs from the paper's default (``-k3``, ``-lb2``, ``-remask-none``, ``-start-mask``,
``-nopos``, ``-st1``, ``-init-ar``, ``-recipe-plain``, ``-glat`` (``-glat0.3-0.1`` at other glancing
ratios), ``-lenoff``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Any

from bench import families
from bench.families.base import Context, Family, System, TrainCell
from bench.columns import Column, fixed
from narbench_core import defaults as d
from narbench_core.errors import UserError
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
    glance_start: tuple[float, ...] | None = None        # None: (GLANCE_START,), and suites without it keep their hash
    glance_end: tuple[float, ...] | None = None          # None: (GLANCE_END,)
    exclude: tuple[dict[str, Any], ...] | None = None    # None, not (): suites without it keep their hash

    def values(self, axis: str) -> tuple:
        """The values of ``axis`` (an unset glancing ratio: its default)."""
        value = getattr(self, axis)
        return (DEFAULTS[axis],) if value is None else value

    def excluded(self, values: dict[str, Any]) -> bool:
        """Does one of the ``exclude`` tables match these axis values? (A list value: any of its items.)"""
        return any(all(values[k] in _any_of(v) for k, v in rule.items()) for rule in self.exclude or ())


def _any_of(value: Any) -> list:
    """An ``exclude`` value as the list of values it matches."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


AXES = tuple(f.name for f in fields(PaDIRSection) if f.name != "exclude")
DEFAULTS = {"unmask_rate": d.UNMASK_RATE, "length_hyps": d.LENGTH_HYPS, "length_bonus": d.LENGTH_BONUS,
            "remask": d.REMASK, "start": d.START, "positional_attention": d.POSITIONAL_ATTENTION, "stages": d.STAGES,
            "init": d.INIT, "recipe": d.RECIPE, "glancing": d.GLANCING, "length_predictor": d.LENGTH_PREDICTOR,
            "glance_start": d.GLANCE_START, "glance_end": d.GLANCE_END}    # the paper's (iterations, distill: none)

# axis -> (the test on a system's axis values that silences it, that setting as a spec writes it, why):
# the axis then changes nothing the system computes. (A row from before an axis existed holds None.)
SILENCED_BY: dict[str, tuple[Any, str, str]] = {
    # models/train.py _padir_loss passes glanced counts (n_keep) to losses.padir_noise, which then never
    # reads the rate; the dev NLL of a learning curve (no step) still draws its noise with it.
    "unmask_rate": (lambda v: bool(v.get("glancing")), "glancing = true",
                    "stage 1 keeps a glanced number of reference tokens instead"),
    "glance_start": (lambda v: not v.get("glancing"), "glancing = false", "no glancing pass"),
    "glance_end": (lambda v: not v.get("glancing"), "glancing = false", "no glancing pass"),
    "remask": (lambda v: v.get("iterations") == 1, "iterations = 1", "one pass: nothing is re-masked"),
}


def silenced(values: dict[str, Any]) -> dict[str, str]:
    """The axes that act nowhere in a system with these axis values -> the setting that silences each."""
    return {axis: setting for axis, (test, setting, _) in SILENCED_BY.items() if test(values)}


def live(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every silenced axis set to None."""
    dead = silenced(values)
    return {k: (None if k in dead else v) for k, v in values.items()}


def _show_values(values) -> str:
    """"0.15, 0.3 and 0.5"."""
    shown = [f"{v:g}" if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _toml(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else f"{value:g}"


def _dead_axes(section: PaDIRSection, combos: list[dict[str, Any]]) -> tuple[str, str] | None:
    """``(axis, message)`` of the first axis the section sweeps where a setting silences it (two of its
    values in systems that differ in nothing else), or of a value other than the default that acts
    in no system; None when every swept axis acts."""
    for axis, (_, setting, why) in SILENCED_BY.items():
        groups: dict[tuple, set] = {}
        acting = set()
        for c in combos:
            if axis in silenced(c):
                groups.setdefault(tuple((k, v) for k, v in c.items() if k != axis), set()).add(c[axis])
            else:
                acting.add(c[axis])
        for same in groups.values():
            if len(same) > 1:
                keep = DEFAULTS[axis] if DEFAULTS[axis] in same else min(same)
                others = sorted(same - {keep})
                return axis, (f"{setting} silences it ({why}), so {_show_values([keep, *others])} give identical "
                              f"systems there; keep one: exclude = [{{{setting}, {axis} = {_toml(others)}}}]")
        idle = [v for v in section.values(axis) if v not in acting and v != DEFAULTS.get(axis)]
        if idle:
            return axis, (f"{_show_values(idle)} acts in no system: {setting} silences it ({why}); drop "
                          f"{'it' if len(idle) == 1 else 'them'}")
    return None


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
                kind = type(section.values(key)[0])
                if (isinstance(v, list) and not v) or any(type(x) is not kind and not (kind is float and type(x) is int)
                                                          for x in _any_of(v)):
                    raise Invalid(f"{key} = {v!r}: expected a {kind.__name__} like the section's {key} values "
                                  f"{list(section.values(key))}, or a non-empty list of them")
        return tuple(dict(rule) for rule in value)
    return check


def _suffix(v: dict[str, Any]) -> str:
    """One name part per live axis (``v``: a system's axis values, None where silenced) that differs from
    the paper's default."""
    def differs(axis: str) -> bool:
        return v.get(axis) is not None and v[axis] != DEFAULTS[axis]

    glance = ((v.get("glance_start"), v.get("glance_end")) if differs("glance_start") or differs("glance_end")
              else None)
    return ((f"-k{v['length_hyps']}" if differs("length_hyps") else "")
            + (f"-lb{v['length_bonus']}" if differs("length_bonus") else "")
            + (f"-remask-{v['remask']}" if differs("remask") else "")
            + (f"-start-{v['start']}" if differs("start") else "")
            + ("-nopos" if differs("positional_attention") else "")
            + (f"-st{v['stages']}" if differs("stages") else "")
            + (f"-init-{v['init']}" if differs("init") else "")
            + (f"-recipe-{v['recipe']}" if differs("recipe") else "")
            + (("-glat" if v["glancing"] else "-noglat") if differs("glancing") else "")
            + (f"{glance[0]:g}-{glance[1]:g}" if glance else "")
            + ({"offset": "-lenoff", "absolute": "-lenabs"}[v["length_predictor"]]
               if differs("length_predictor") else ""))


def _variant(v: dict[str, Any]) -> str:
    """A system's name without its iterations (``v``: its live axis values)."""
    rate = "" if v.get("unmask_rate") is None else f"-u{v['unmask_rate']:g}"
    return f"padir{rate}{'-distill' if v.get('distill') else ''}{_suffix(v)}"


TRAINING_AXES = ("unmask_rate", "distill", "positional_attention", "stages", "init", "recipe", "glancing",
                 "length_predictor", "glance_start", "glance_end")
DECODING_AXES = ("iterations", "length_hyps", "length_bonus", "remask", "start")


class PaDIRFamily(Family):
    name, label, paradigm, model_kind = "padir", "PaDIR", "nar", "padir"
    shares_worker = True           # JAX decoders: one XLA runtime, one refinement loop for every T and model
    interaction = ("distill", "iterations")
    columns = (
        Column("iterations", "T", doc="refinement iterations T: at most T decoder passes (a row stops early "
                                     "once an iteration changes none of its tokens)"),
        Column("unmask_rate", "unmask rate", fixed(2), doc="training noise: share of target tokens kept correct "
                                                           "(None where glancing silences it)"),
        Column("length_hyps", "k", doc="length hypotheses"),
        Column("length_bonus", "len +", optional=True, doc="tokens added to every predicted length"),
        Column("remask", doc="what is re-masked between iterations: none | stutter | mask-predict (None at T = 1: "
                             "one pass re-masks nothing)"),
        Column("start", doc="initial hypothesis: random | mask"),
        Column("positional_attention", doc="the decoder has the positional-attention sublayer"),
        Column("stages", doc="training stages (stage 2 refines stage 1's argmax)"),
        Column("init", "init", align="left", doc="parameters: random, or warm-started from the AR model"),
        Column("recipe", align="left",
               doc="reference (fixed EOS, [LENGTH] query, stage-2 remasking) or plain (none of them)"),
        Column("glancing", doc="glancing training (GLAT)", optional=True),
        Column("glance_start", "glance from", fixed(2), optional=True,
               doc="glancing ratio at the first training step (None without glancing)"),
        Column("glance_end", "glance to", fixed(2), optional=True,
               doc="glancing ratio at the last training step, annealed linearly (None without glancing)"),
        Column("length_predictor", "length classes", align="left", optional=True,
               doc="absolute lengths, or offsets from the source length"),
    )

    def parse(self, table) -> PaDIRSection:
        s = PaDIRSection()
        positive = list_of(integer(1), "positive integers")
        flags = list_of(boolean, "true/false")
        ratios = list_of(number(0.0, 1.0), "numbers in [0, 1]")
        if table.get("steps", lambda v: v, None) is not None:
            table.fail("steps", "renamed: write the refinement iterations T as `iterations`")
        section = PaDIRSection(
            iterations=table.get("iterations", positive, s.iterations),
            unmask_rate=table.get("unmask_rate", ratios, s.unmask_rate),
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
            glance_start=table.get("glance_start", ratios, None),
            glance_end=table.get("glance_end", ratios, None),
        )
        section = replace(section, exclude=table.get("exclude", _exclusions(section), None))
        table.done()
        combos = [c for c in (dict(zip(AXES, values)) for values in itertools.product(*map(section.values, AXES)))
                  if not section.excluded(c)]
        if not combos:
            table.fail("exclude", "the rules exclude every system of the section")
        dead = _dead_axes(section, combos)
        if dead:
            table.fail(*dead)
        return section

    def expand(self, section: PaDIRSection, ctx: Context) -> list[System]:
        out = []
        for training in itertools.product(*map(section.values, TRAINING_AXES)):
            trained = dict(zip(TRAINING_AXES, training))
            cell = self._cell(live(trained), ctx)         # one model for every decoding of it
            for decoding in itertools.product(*map(section.values, DECODING_AXES)):
                given = {**trained, **dict(zip(DECODING_AXES, decoding))}
                if section.excluded(given):
                    continue
                v = live(given)
                variant = _variant(v)
                name = f"padir-s{v['iterations']}" + variant.removeprefix("padir")
                options = {**ctx.shapes, "length_hyps": v["length_hyps"], "remask": given["remask"],
                           "start": v["start"], "seed": ctx.seed, "length_bonus": v["length_bonus"]}
                info = {**{a: v[a] for a in AXES if a != "distill"}, "hypotheses": v["length_hyps"],
                        "decoder": f"refine:{v['iterations']}", "variant": variant}
                out.append(System(name, self.name, f"refine:{v['iterations']}", cell,
                                  tuple(sorted(options.items())), tuple(info.items())))
        return out

    def _cell(self, v: dict[str, Any], ctx: Context) -> TrainCell:
        """The training cell of a system with live axis values ``v``: its training axes that act (the
        glancing axes only where they differ from the defaults, so cells without them keep their labels)."""
        axes = tuple((a, v[a]) for a in ("positional_attention", "recipe", "stages", "unmask_rate")
                     if v[a] is not None)
        extra = tuple((a, v[a]) for a in ("glance_start", "glance_end") if v[a] is not None and v[a] != DEFAULTS[a])
        if v["glancing"] != d.GLANCING:
            axes = (("glancing", v["glancing"]),) + extra + axes
        if v["length_predictor"] != d.LENGTH_PREDICTOR:
            axes = (("length_predictor", v["length_predictor"]),) + axes
        return TrainCell(ctx.task, self.name, ctx.seed, axes, ctx.teacher if v["distill"] else None,
                         ctx.teacher if v["init"] == "ar" else None)

    def axes_configs(self, axes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        given = {**{a: DEFAULTS[a] for a in ("glancing",)}, **axes}
        for axis, setting in silenced(given).items():
            if axis in axes:
                raise UserError(f"{axis} has no effect with {setting} ({SILENCED_BY[axis][2]}); drop it")
        reference = axes.pop("recipe", d.RECIPE) == "reference"
        return ({"positional_attention": axes.pop("positional_attention", d.POSITIONAL_ATTENTION),
                 "fixed_eos": reference, "length_token": reference,
                 "length_offset": axes.pop("length_predictor", d.LENGTH_PREDICTOR) == "offset"},
                {"unmask_rate": axes.pop("unmask_rate", d.UNMASK_RATE), "stages": axes.pop("stages", d.STAGES),
                 "stage_remask": reference, "glancing": axes.pop("glancing", d.GLANCING),
                 "glance_start": axes.pop("glance_start", d.GLANCE_START),
                 "glance_end": axes.pop("glance_end", d.GLANCE_END)})

    def train_work(self, values) -> float:
        """Decoder passes a training step runs, a forward and backward counting 3: 3 per stage, plus 1 for
        glancing's forward pass (the encoder's share is left out)."""
        return 3.0 * (values.get("stages") or d.STAGES) + (1.0 if values.get("glancing") else 0.0)

    def live_values(self, row) -> dict[str, Any]:
        """A row's axis values (``AXES`` and ``distill``), None where a setting silences the axis (rows
        written before the silenced axes were dropped still hold a value there). Glancing rows from before
        the glancing ratios were axes trained at the default ratios: they read so."""
        values = {**{a: row.get(a) for a in AXES}, "distill": bool(row.get("distill"))}
        if values["glancing"] and values["glance_start"] is None and values["glance_end"] is None:
            values.update(glance_start=d.GLANCE_START, glance_end=d.GLANCE_END)
        return live(values)

    def diagnosed(self, row, iterations: int | None = None, length_hyps: int | None = None,
                  keep_repeats: bool = False) -> tuple[str, dict[str, Any]]:
        options = {**dict(row.decoder_options or {}), "length_hyps": length_hyps or row.hypotheses,
                   "keep_repeats": keep_repeats}
        return f"refine:{iterations or row.iterations}", options

    def grid_axes(self, row) -> dict[str, Any]:
        return self.live_values(row)

    def grid_reference(self, axis: str, values: list) -> Any:
        return DEFAULTS.get(axis) if DEFAULTS.get(axis) in values else min(values)

    def sort_key(self, row) -> tuple:
        rate = row.unmask_rate if self.live_values(row)["unmask_rate"] is not None else -1.0
        return (bool(row.distill), rate, row.iterations or 0, row.system)

    def point_label(self, row) -> str:
        v = self.live_values(row)
        rate = "" if v["unmask_rate"] in (None, d.UNMASK_RATE) else f" u{v['unmask_rate']:g}"
        rest = _suffix(v)
        return f"T={row.iterations}{rate}{rest.replace('-', ' ')}"

    def name_parts(self, row) -> list[tuple[str, str | None, bool]]:
        v = self.live_values(row)

        def part(axis: str, text) -> tuple[str, str | None, bool]:   # silenced, or the row predates the axis: None
            return axis, None if v[axis] is None else text(v[axis]), axis == "iterations"

        def glancing(on: bool) -> str:
            ratio = (f" {v['glance_start']:g}→{v['glance_end']:g}"
                     if None not in (v["glance_start"], v["glance_end"]) else "")
            return f", glancing{ratio}" if on else ", no glancing"

        return [part("iterations", lambda x: f"T={x}"),
                part("length_hyps", lambda x: f"k={x}"),
                part("unmask_rate", lambda x: f"u={x:g}"),
                part("length_bonus", lambda x: f"len{x:+d}"),
                part("distill", lambda x: ", distilled" if x else ", raw"),
                part("glancing", glancing),
                part("remask", lambda x: f", remask {x}"),
                part("start", lambda x: f", {x} start"),
                part("init", lambda x: ", from AR" if x == "ar" else f", {x} init"),
                part("recipe", lambda x: f", {x} recipe"),
                part("length_predictor", lambda x: ", length offsets" if x == "offset" else ", absolute lengths"),
                part("positional_attention", lambda x: "" if x else ", no positional attention"),
                part("stages", lambda x: f", {x} stage{'s' * (x != 1)}")]

    def style(self, row) -> dict[str, Any]:
        if row.distill:
            return {"color": "#c0392b", "marker": "o", "label": "PaDIR, distilled"}
        return {"color": "#e67e22", "marker": "o", "label": "PaDIR (T = iterations)"}


families.register(PaDIRFamily())
