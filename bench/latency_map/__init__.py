"""The latency map (``narbench latency --map``); its code is being split into modules, all in
``cells.py`` for now. Every public name is re-exported here so callers keep importing
``bench.latency_map``."""
from bench.latency_map.cells import *  # noqa: F401,F403
