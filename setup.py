"""Build the compiled kernels: the Cython module plus the C loops it dispatches to."""

import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# GCC and Clang: -O3 so the loops vectorize whatever the interpreter's own
# CFLAGS say.  No -march: the wheel must run on any x86-64; AVX2 and AVX-512
# variants are compiled per function (src/kvest/_src/loops.c) and picked at run time.
# -g0: no debug info in the wheel (the interpreter's CFLAGS usually carry -g,
# which would make the two extensions six times their size); the symbol table
# stays, so profilers and valgrind still name kvest's functions.
# KVEST_CFLAGS adds flags for special builds (sanitizers, see tools/); they come
# later on the command line, so a -g there wins over the -g0 here.
compile_args = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-g0"]
compile_args += os.environ.get("KVEST_CFLAGS", "").split()
link_args = os.environ.get("KVEST_LDFLAGS", "").split()

SRC = "src/kvest"
HEADERS = [f"{SRC}/_src/{name}" for name in
           ("loops.h", "loops_body.h", "loops_variant.h", "loops_avx2.h", "rows.h",
            "reqattr.h", "reqwrite.h", "reqroute.h", "addrorder.h", "fence.h")]
# KVEST_PUBLIC_API_ONLY=1 builds the request kernels on CPython's public API
# alone, as they are built for any Python newer than the newest one CI tests
# (src/kvest/_src/fence.h; docs/development.md lists what that fence keeps out).
public_only = os.environ.get("KVEST_PUBLIC_API_ONLY", "").strip().lower() in (
    "1", "true", "yes", "on")
common = dict(
    include_dirs=[np.get_include(), f"{SRC}/_src"],
    depends=[*HEADERS, f"{SRC}/_common.pxd", f"{SRC}/_reqs.pxd"],
    define_macros=[
        # The oldest NumPy C API the module may use, and the runtime floor it
        # supports: keep in step with `dependencies` in pyproject.toml.
        ("NPY_NO_DEPRECATED_API", "NPY_1_25_API_VERSION"),
        ("NPY_TARGET_VERSION", "NPY_1_25_API_VERSION"),
        *([("KVEST_PUBLIC_API_ONLY", "1")] if public_only else []),
    ],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
)

extensions = [
    # Array kernels, with the C loops and their runtime CPU dispatch.
    Extension("kvest._kernels", sources=[f"{SRC}/_kernels.pyx", f"{SRC}/_src/loops.c"],
              **common),
    # Request-object kernels, readers and writers (served as kvest._writes too):
    # the request core compiled once; only inline helpers from loops.h.
    Extension("kvest._reqs", sources=[f"{SRC}/_reqs.pyx"], **common),
    # The SGLang glue's compiled half, on kvest._reqs' kernels (its .pxd).
    Extension("kvest.sglang._glue", sources=[f"{SRC}/sglang/_glue.pyx"], **common),
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": 3},
                            include_path=["src"]))
