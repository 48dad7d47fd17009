# Where the programs find their shared libraries at run time, so that they also run where they were
# not built (scripts/gpu-bundle.sh carries them to a GPU machine):
#   $ORIGIN             a libnccl.so.2 put next to the program;
#   $ORIGIN/../lib      a lib/ beside its bin/ (the bundle's, with Gloo's and spdlog's libraries);
#   DIST_NCCL_RUNTIME_DIRS  more directories, e.g. the pip NCCL of a machine's torch
#                       (.../site-packages/nvidia/nccl/lib; scripts/gpu-check.sh links it into the
#                       bundle's lib/ instead, wherever Python has it);
# then, in the build tree only, the directories CMake linked from (/usr/local/cuda/lib).
# As DT_RPATH (--disable-new-dtags), not RUNPATH: RUNPATH would not serve the libraries those
# libraries need (libgloo's libibverbs, spdlog's libfmt), and PyTorch's own libraries use RPATH.
# Which NCCL was loaded is logged by every NCCL group (dist::sdk::nccl_version()).
set(DIST_NCCL_RUNTIME_DIRS "" CACHE STRING
    "More run-time search directories for libnccl.so.2 (a ;-list), after $ORIGIN and $ORIGIN/../lib")
set(CMAKE_BUILD_RPATH "\$ORIGIN;\$ORIGIN/../lib;${DIST_NCCL_RUNTIME_DIRS}")
set(CMAKE_INSTALL_RPATH "\$ORIGIN;\$ORIGIN/../lib;${DIST_NCCL_RUNTIME_DIRS}")
add_link_options(LINKER:--disable-new-dtags)
