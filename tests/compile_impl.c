/* Compile check: the implementation TU (also compiled as C++). */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
