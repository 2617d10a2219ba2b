"""The CTranslate2 family: the suite's AR model exported to CTranslate2, a tuned CPU inference engine,
so speedups can be read against the AR decoding a user would deploy, not only narbench's JAX AR.

Spec section (needs the optional extra: ``pip install -e ".[ct2]"``)::

    [ct2]
    decoders = ["greedy", "beam:5", "int8:greedy"]   # [int8:]greedy | [int8:]beam:K
    length_penalty = 0.6                             # beam search's length penalty
    threads = [1, 2]                                 # intra-op threads (0 = every core): one value, or an
                                                     # axis (every decoder at every count)

Systems are named ``ct2-greedy``, ``ct2-beam5``, ``ct2-int8-greedy``, with ``-t{N}`` appended when
``threads`` lists several counts (a CPU user deploys the count that is fastest, so the fastest-AR
anchor is each engine at its best measured setting). They run the AR cell's checkpoint (nothing more
is trained), exported once into ``<data root>/ct2/``. Float32 greedy should reproduce AR greedy:
every row carries ``agreement_with_ar_greedy``.

Each system is timed in a worker process of its own (``bench.measure.workers``). A one-thread worker sets
``OMP_WAIT_POLICY=PASSIVE`` (``worker_env``): measured interleaved with JAX AR greedy, int8 greedy on
1 thread took 21.4 ms with it against 39.7 ms without (1.73x its solo time). A multi-threaded worker
keeps libgomp's default spin: float32 greedy on 2 threads took 56 ms spinning against 86 ms passive
(its threads wake for every parallel region), with JAX AR next to it 1.04x its solo time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bench import families
from bench.families.base import Context, Family, System, search_words, thread_counts
from narbench_core import defaults
from suites.spec import list_of, number, string

OMP_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}   # one-thread workers: libgomp sleeps when a call ends (see the docstring)
DECODER_RE = re.compile(r"^(int8:)?(greedy|beam:([1-9][0-9]*))$")


@dataclass(frozen=True)
class CT2Section:
    decoders: tuple[str, ...] = ("greedy", f"beam:{defaults.BEAM_SIZE}", "int8:greedy")
    length_penalty: float = defaults.LENGTH_PENALTY
    threads: tuple[int, ...] = (0,)


def system_name(decoder: str) -> str:
    """``int8:beam:5`` -> ``ct2-int8-beam5``."""
    m = DECODER_RE.match(decoder)
    search = "greedy" if m[2] == "greedy" else f"beam{m[3]}"
    return "ct2-" + ("int8-" if m[1] else "") + search


class CT2Family(Family):
    name, label, paradigm = "ct2", "CTranslate2", "ar"
    trains = False                                 # runs the AR family's model

    def parse(self, table) -> CT2Section:
        d = CT2Section()
        section = CT2Section(
            decoders=table.get("decoders", list_of(string(DECODER_RE, what='"[int8:]greedy" or "[int8:]beam:K"'),
                                                   '"[int8:]greedy" or "[int8:]beam:K" strings'), d.decoders),
            length_penalty=table.get("length_penalty", number(0.0), d.length_penalty),
            threads=table.get("threads", thread_counts, d.threads))
        table.done()
        return section

    def expand(self, section: CT2Section, ctx: Context) -> list[System]:
        out = []
        swept = len(section.threads) > 1
        for decoder, threads in ((d, t) for d in section.decoders for t in section.threads):
            m = DECODER_RE.match(decoder)
            search = m[2]
            beam = 1 if search == "greedy" else int(m[3])
            quantization = "int8" if m[1] else "float32"
            options = {"buckets": ctx.shapes.get("buckets"), "max_decode_length": ctx.shapes.get("max_decode_length"),
                       "threads": threads, "quantization": quantization,
                       **({"length_penalty": section.length_penalty} if beam > 1 else {})}
            options = {k: v for k, v in options.items() if v is not None}
            info = {"hypotheses": beam, "decoder": decoder, "variant": None}
            name = system_name(decoder) + (f"-t{threads}" if swept else "")
            out.append(System(name, self.name, search, ctx.teacher, tuple(sorted(options.items())),
                              tuple(info.items())))
        return out

    def check_installed(self) -> None:
        from models import ct2

        ct2.require_ctranslate2()

    def load_decoder(self, checkpoint_dir, spec: str, **options: Any):
        from models import ct2

        return ct2.load_decoder(checkpoint_dir, spec, **options)

    def serving_options(self, serving) -> dict[str, Any]:
        """CTranslate2's own batching of a served batch (``translate_batch``'s max_batch_size and batch_type, which
        its documentation recommends setting for throughput; batch_type "tokens" sorts a batch by length)."""
        return {"max_batch_size": serving.ct2_max_batch_size, "batch_type": serving.ct2_batch_type}

    def worker_env(self, options) -> dict[str, str]:
        return dict(OMP_ENV) if options.get("threads") == 1 else {}

    def point_label(self, row) -> str:
        return row.system.removeprefix("ct2-")

    def name_parts(self, row) -> list[tuple[str, str, bool]]:
        m = DECODER_RE.match(row.decoder or "")
        if m is None:
            return super().name_parts(row)
        threads = row.engine_threads
        return [("decoder", search_words(m[2]), True),
                ("quantization", ", int8" if m[1] else ", float32", False),
                ("threads", "" if threads is None else f", {threads} thread{'s' * (threads != 1)}", False)]

    def style(self, row) -> dict[str, Any]:
        return {"color": "#2e8b57", "marker": "D", "label": self.label}


families.register(CT2Family())
