"""Measuring a system: the timing protocol and its worker processes, statistics, quality metrics, the run's environment."""
