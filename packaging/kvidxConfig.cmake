# CMake package config for kvidx, a single-header C library.
#
#   find_package(kvidx CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE kvidx::kvidx)
#
# kvidx::kvidx is an INTERFACE target: it adds the include directory that
# holds kvidx.h and links Threads::Threads (the default build uses atomics
# and may use pthreads; define KVIDX_NO_THREADS to need neither).  Define
# KVIDX_IMPLEMENTATION in exactly one source file before including kvidx.h.
# xxhash.h (Debian: libxxhash-dev) must be on the include path when that file
# is compiled; it is inlined, so no xxhash library is linked.
#
# Installed as <prefix>/lib/cmake/kvidx/kvidxConfig.cmake; the prefix is
# found relative to this file, so the installed tree can be moved.

include(CMakeFindDependencyMacro)
find_dependency(Threads)

get_filename_component(_kvidx_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET kvidx::kvidx)
  add_library(kvidx::kvidx INTERFACE IMPORTED)
  set_target_properties(kvidx::kvidx PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_kvidx_prefix}/include"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()

set(kvidx_INCLUDE_DIRS "${_kvidx_prefix}/include")
unset(_kvidx_prefix)
