"""Cost model (XLA costs, machine peaks and rates, accelerator projections): see ``bench.costs.xla``."""
from bench.costs.xla import *  # noqa: F401,F403
from bench.costs.xla import (  # noqa: F401  (private names the tests reach)
    _COSTS, _Probe, _bucket_key, _loop, _rates, _seconds)
