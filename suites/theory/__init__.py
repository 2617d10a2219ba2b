"""Theory suites of the paper: Ising k-pseudolikelihood, k-Gibbs vs parallel sampling, attention dependency."""
