"""forerun: SGLang frontend programs that move the next model call's work off the critical path.

Namespaces (one folder of the repository each), bottom to top:
    forerun.runtime_ext  where it runs (embedded CPU engine, SGLang server backends and launcher, ready cache,
                         the stand-in SGLang server)
    forerun.programs     what is computed (sgl.function programs, samplers, engine-free MH core)
    forerun.classifiers  what is predicted (certainty classifier)
    forerun.eval         how it is measured (datasets, graders, the eval harness, benchmarks)
    forerun.cli          the one `forerun` command
    forerun.testing      test doubles (toy models, oracles); never imported by the rest
"""

__version__ = "0.1.0"
