"""Serving under load: a suite's systems served by MLPerf LoadGen through a dynamic batcher (docs/serving.md).

``batcher`` forms batches for one server; ``loadgen`` runs one LoadGen test and reads its logs; ``measure`` runs a
system's scenarios; ``run`` is the runner's ``[serving]`` step; ``rows`` declares ``serving.jsonl``'s columns;
``report`` writes ``serving.md``, ``serving.png`` and the leaderboard's section.
"""
