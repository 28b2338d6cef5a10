"""forerun: SGLang frontend programs that move the next model call's work off the critical path.

Namespaces (one folder of the repository each):
    forerun.programs     what is computed (sgl.function programs, samplers, engine-free MH core)
    forerun.runtime_ext  where it runs (embedded CPU engine, SGLang server backend, ready cache)
    forerun.classifiers  what is predicted (certainty classifier)
    forerun.eval         how it is measured (datasets, graders, benchmarks, CLI)
"""

__version__ = "0.1.0"
