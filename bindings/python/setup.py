"""Builds the kvidx shared library for the Python package (see pyproject.toml).

The library is compiled from libkvidx.c and the single header kvidx.h (found
at ../../kvidx.h in the source tree, or KVIDX_HEADER_DIR) as a plain shared
object `_kvidx_native*.so` installed next to kvidx.py; kvidx.py loads it with
ctypes (no Python C API is used, so no Python headers are needed).  xxhash.h
must be on the include path (Debian: libxxhash-dev)."""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def header_dir():
    d = os.environ.get("KVIDX_HEADER_DIR") or os.path.join(HERE, "..", "..")
    if not os.path.exists(os.path.join(d, "kvidx.h")):
        sys.exit(f"kvidx: kvidx.h not found in {os.path.abspath(d)} "
                 "(build from the kvidx source tree or set KVIDX_HEADER_DIR)")
    return os.path.abspath(d)


class BuildLib(build_ext):
    """A ctypes library, not an extension module: no PyInit_ symbol."""

    def get_export_symbols(self, ext):
        return []


setup(
    py_modules=["kvidx"],
    ext_modules=[Extension(
        "_kvidx_native", ["libkvidx.c"], include_dirs=[header_dir()],
        extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"],
        extra_link_args=["-pthread"])],
    cmdclass={"build_ext": BuildLib},
)
