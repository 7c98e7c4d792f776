"""The package's one compiled part, the plan engine's C (algorithms/runtime/compiled_engine.c), as
an optional extension: where it cannot be built (no C compiler), the install goes on and the
Python engine runs every plan (``algorithms.runtime.compiled.MISSING`` says why)."""

from setuptools import Extension, setup

try:  # the C reads a NumPy array's fields through NumPy's header (no NumPy: no extension, as without a compiler)
    from numpy import get_include
    NUMPY = [get_include()]
except ImportError:
    NUMPY = []

setup(ext_modules=[Extension("algorithms.runtime._compiled_engine", ["algorithms/runtime/compiled_engine.c"],
                             depends=["algorithms/kernels/bfloat16.h"], include_dirs=NUMPY,
                             extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"], optional=True)])
