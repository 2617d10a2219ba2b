"""The paper's theory experiments: Ising k-pseudolikelihood, k-Gibbs vs parallel sampling, attention
dependency of a PaDIR model.

An application like ``bench/`` (``narbench theory`` runs it): it may import ``bench``, ``models`` and
``suites``, which never import it.
"""
