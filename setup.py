"""The package's one compiled part, the plan engine's C (algorithms/runtime/compiled_engine.c), as
an optional extension: where it cannot be built (no C compiler), the install goes on and the
Python engine runs every plan (``algorithms.runtime.compiled.MISSING`` says why)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("algorithms.runtime._compiled_engine", ["algorithms/runtime/compiled_engine.c"],
                             depends=["algorithms/kernels/bfloat16.h"],
                             extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"], optional=True)])
