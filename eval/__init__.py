"""How it is measured: datasets, graders, metrics, statistics, benchmarks and the `forerun` CLI."""
