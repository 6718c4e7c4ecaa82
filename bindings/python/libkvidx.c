/* libkvidx.c - the shared library behind bindings/python/kvidx.py.
 * `make python` builds build/libkvidx.so from this file and kvidx.h. */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
