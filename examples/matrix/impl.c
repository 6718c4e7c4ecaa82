/* matrix/impl.c - the implementation TU of the compile matrix. */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
