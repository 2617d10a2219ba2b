"""``python -m bench.cli``: the ``narbench`` command without installing narbench (a GPU host's own JAX, say)."""
import sys

from bench.cli import main

sys.exit(main())
