"""The harness: the plan and runner of a suite, its results store and row schema, system families; measurement, costs, the latency map, reports and the command line in sub-packages."""
