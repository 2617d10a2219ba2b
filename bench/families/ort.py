"""The ONNX Runtime family: the suite's PaDIR models exported to ONNX and run by ONNX Runtime, float32 or
int8, so the fastest NAR is compared with the fastest AR with both sides on a tuned CPU runtime
(CTranslate2 for AR; ``models/ort.py`` for PaDIR).

Spec section (needs the optional extra: ``pip install -e ".[ort]"``); it picks which of the ``[padir]``
section's systems also run on ONNX Runtime (each list a filter; an absent key keeps every value)::

    [ort]
    iterations = [1, 2, 4, 10]           # refinement iterations T of the [padir] systems to run ([]: none)
    length_hyps = [1, 5]                 # their length hypotheses k
    distill = [true]                     # their models: distilled, raw or both
    quantization = ["float32", "int8"]   # weights and matmuls in float32, or int8 (dynamic quantization)
    threads = [1, 2]                     # intra-op threads (0 = every core): one value, or an axis
    exclude = [{iterations = 10, length_hyps = 5}]   # (T, k) combinations left out

A system is the [padir] system's name plus ``-ort-{quantization}`` and, when ``threads`` lists several
counts, ``-t{N}``: ``padir-s4-distill-k1-...-ort-int8-t1``. It runs the same model (nothing more is
trained), exported once per checkpoint and quantization into ``<data root>/onnx/``, with the same decoding
options (T, k, remask, start, length bonus, seed); float32 reproduces JAX PaDIR's outputs: each row names
its JAX system (``reproduces``) and the share of sentences where the two agree (``reproduced_agreement``). Each system is timed in a worker process of its own. A session on more than one thread runs with its pool's
spinning off (``session.intra_op.allow_spinning = 0``): in a plain script on the 2-core Intel Xeon of
results/default/20261127T090139Z-34276f4b (git history at bc36385; one thread per core), 2-thread float32 T = 1 took 7.2 ms p50 with it
off against 10.4 ms spinning, int8 T = 4 11.7 against 19.2 ms; in that run, timed spinning, the float32 T = 1
2-thread row's solo check read 0.84 (its solo time slower than its interleaved one). One thread was faster than
two for every system there, so the default suite times one thread and `anchors` both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import families
from bench.columns import Column
from bench.families.base import Context, Family, System, thread_counts
from suites.spec import boolean, integer, list_of, string

QUANTIZATIONS = ("float32", "int8")
SOURCE = "padir"                       # the family whose systems this one runs on ONNX Runtime


@dataclass(frozen=True)
class ORTSection:
    iterations: tuple[int, ...] | None = None      # None: every value of the [padir] systems
    length_hyps: tuple[int, ...] | None = None
    distill: tuple[bool, ...] | None = None
    quantization: tuple[str, ...] = QUANTIZATIONS
    threads: tuple[int, ...] = (1,)
    exclude: tuple[dict[str, Any], ...] = ()         # combinations of iterations and length_hyps left out


EXCLUDABLE = ("iterations", "length_hyps")


def _keeps(section: ORTSection, system: System) -> bool:
    info = dict(system.info)
    return ((section.iterations is None or info.get("iterations") in section.iterations)
            and (section.length_hyps is None or info.get("length_hyps") in section.length_hyps)
            and (section.distill is None or (system.cell.teacher is not None) in section.distill)
            and not any(all(info.get(k) in (v if isinstance(v, list) else [v]) for k, v in rule.items())
                        for rule in section.exclude))


def _exclusions(value) -> tuple[dict[str, Any], ...]:
    """``exclude``: tables of ``iterations`` and ``length_hyps`` values (a number or a list of them); a
    [padir] system with all the values of one table does not run on ONNX Runtime ([]: no rule, so a suite
    that extends another can drop its rules)."""
    from suites.spec import Invalid

    if not isinstance(value, list) or not all(isinstance(r, dict) and r for r in value):   # []: none
        raise Invalid(f"expected a list of tables such as {{iterations = 10, length_hyps = 5}}, got {value!r}")
    for rule in value:
        for key, v in rule.items():
            if key not in EXCLUDABLE:
                raise Invalid(f"{key!r} cannot be excluded here; use {' or '.join(EXCLUDABLE)}")
            if not all(type(x) is int and x >= 1 for x in (v if isinstance(v, list) else [v])) or v == []:
                raise Invalid(f"{key} = {v!r}: expected a positive integer or a non-empty list of them")
    return tuple(dict(r) for r in value)


class ORTFamily(Family):
    name, label, paradigm = "ort", "PaDIR ORT", "nar"
    trains = False                                 # runs the PaDIR family's models
    columns = (Column("quantization", align="left", optional=True,
                      doc="weights of a system on an inference runtime: float32, or int8 (ONNX Runtime's "
                          "dynamic quantization)"),)

    def parse(self, table) -> ORTSection:
        positive = list_of(integer(1), "positive integers", empty=True)       # []: none (a suite that extends
        section = ORTSection(                                                 # another drops its systems so)
            iterations=table.get("iterations", positive, None),
            length_hyps=table.get("length_hyps", positive, None),
            distill=table.get("distill", list_of(boolean, "true/false", empty=True), None),
            quantization=table.get("quantization", list_of(string(choices=QUANTIZATIONS),
                                                           f"one of {', '.join(QUANTIZATIONS)}"), QUANTIZATIONS),
            threads=table.get("threads", thread_counts, ORTSection.threads),
            exclude=table.get("exclude", _exclusions, ()))
        table.done()
        return section

    def expand(self, section: ORTSection, ctx: Context) -> list[System]:
        out = []
        swept = len(section.threads) > 1
        for system in (s for s in ctx.earlier if s.family == SOURCE and _keeps(section, s)):
            for quantization in section.quantization:
                for threads in section.threads:
                    options = {**dict(system.options), "quantization": quantization, "threads": threads,
                               **({} if threads == 1 else {"spinning": False})}
                    suffix = f"-ort-{quantization}" + (f"-t{threads}" if swept else "")
                    info = {**dict(system.info), "quantization": quantization, "reproduces": system.name,
                            "variant": (dict(system.info).get("variant") or system.name) + suffix}
                    name = system.name + suffix
                    out.append(System(name, self.name, system.decoder, system.cell, tuple(sorted(options.items())),
                                      tuple(info.items())))
        return out

    def check_installed(self) -> None:
        from models import ort

        ort.require_onnxruntime()

    def load_decoder(self, checkpoint_dir, spec: str, **options: Any):
        from models import ort

        return ort.load_decoder(checkpoint_dir, spec, **options)

    def live_values(self, row) -> dict[str, Any]:
        return families.get(SOURCE).live_values(row)

    def sort_key(self, row) -> tuple:
        return (*families.get(SOURCE).sort_key(row), row.quantization or "", row.engine_threads or 0)

    def point_label(self, row) -> str:
        return f"{families.get(SOURCE).point_label(row)} {row.quantization or ''}".strip()

    def name_parts(self, row) -> list[tuple[str, str | None, bool]]:
        """The PaDIR system's parts (distillation always named), then the quantization and the threads."""
        parts = [(axis, text, always or axis == "distill") for axis, text, always in
                 families.get(SOURCE).name_parts(row)]
        threads = (row.decoder_options or {}).get("threads") or row.engine_threads   # 0: every core, as measured
        return parts + [("quantization", None if row.quantization is None else f", {row.quantization}", True),
                        ("threads", None if threads is None else f", {threads} thread{'s' * (threads != 1)}", True)]

    def style(self, row) -> dict[str, Any]:
        int8 = row.quantization == "int8"
        return {"color": "#8e44ad" if int8 else "#2980b9", "marker": "^",
                "label": f"PaDIR on ONNX Runtime, {row.quantization or 'float32'}"}


families.register(ORTFamily())
