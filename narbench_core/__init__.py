"""The dependency-free core that ``bench/``, ``models/``, ``suites/`` and ``theory/`` all import.

It imports nothing from the harness and nothing outside the standard library:

- ``errors``   the user-error type (one line naming the fix, exit code 2);
- ``io``       the one atomic writer (text, JSON, JSON lines, bytes, or any library's own writer);
- ``tokens``   the reserved token ids every vocabulary, model and decoder shares;
- ``defaults`` the shared defaults (decoding, distillation, shape buckets);
- ``paths``    where data, vocabularies, checkpoints and caches live (outside the repo);
- ``runs``     run ids and the plain names of result folders;
- ``lock``     one process at a time per run or checkpoint folder, and the registry of busy processes;
- ``probe``    the one timing protocol for throughput probes (machine peaks and rates, training steps).
"""
