# Where the programs find their shared libraries at run time, so that they also run where they were
# not built (scripts/gpu-bundle.sh carries them to a GPU machine), in this order:
#   $ORIGIN                 a libnccl.so.2 put next to the program;
#   $ORIGIN/../lib          a lib/ beside its bin/ (the bundle's, with Gloo's; on the
#                           GPU machine scripts/gpu-check.sh links the pip NCCL of its torch there);
#   DIST_NCCL_RUNTIME_DIRS  more directories, e.g. a pip NCCL (.../site-packages/nvidia/nccl/lib);
#   the directory of the NCCL this build linked (/usr/local/cuda/lib here), when it has NCCL.
# The same path in the build tree and once installed (BUILD_WITH_INSTALL_RPATH): nothing to rewrite
# at install, so CMake pads nothing (its padding is an empty entry, which ld.so reads as the
# working directory). As DT_RPATH (--disable-new-dtags), not RUNPATH: RUNPATH would not serve the
# libraries those libraries need (libgloo's libibverbs), and PyTorch's own libraries use RPATH.
# Which NCCL was loaded is logged by every NCCL group (dist::sdk::nccl_version()).
set(DIST_NCCL_RUNTIME_DIRS "" CACHE STRING
    "More run-time search directories for libnccl.so.2 (a ;-list), after $ORIGIN and $ORIGIN/../lib")
set(_dist_rpath "\$ORIGIN" "\$ORIGIN/../lib")
if(DIST_NCCL_RUNTIME_DIRS)
  list(APPEND _dist_rpath ${DIST_NCCL_RUNTIME_DIRS})
endif()
if(DIST_NCCL_ENABLED)
  get_filename_component(_dist_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
  list(APPEND _dist_rpath "${_dist_nccl_dir}")
endif()
set(CMAKE_INSTALL_RPATH "${_dist_rpath}")
set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
add_link_options(LINKER:--disable-new-dtags)
