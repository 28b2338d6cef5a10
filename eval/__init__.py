"""How it is measured, one sub-package per job:

    datasets/       the seven evaluation datasets: prompt type, row parsers, offline and hub loading
    graders/        is a response correct: math, multiple choice, code (and the sandbox code runs in)
    harness/        `forerun eval`: methods, settings, run files, the report
    presto/         `forerun bench presto` / `bench reference`: PreSTO's Table 7, side by side
    preposition/    `forerun bench preposition`, gate calibration, the latency model, energy, traces, tasks
    engine_bench/   `forerun bench engine`: the embedded engine against transformers and the roofline
"""
