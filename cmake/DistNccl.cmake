# Resolves DIST_WITH_NCCL (AUTO | ON | OFF) into DIST_NCCL_ENABLED and, when enabled, the imported
# target Dist::nccl (CUDA runtime + NCCL). CUDA and NCCL are looked for under CUDA_HOME or /usr/local/cuda.
set(DIST_NCCL_ENABLED OFF)
string(TOUPPER "${DIST_WITH_NCCL}" _dist_nccl_mode)
if(NOT _dist_nccl_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DIST_WITH_NCCL must be AUTO, ON or OFF (got '${DIST_WITH_NCCL}')")
endif()

if(NOT _dist_nccl_mode STREQUAL "OFF")
  set(_dist_cuda_hints $ENV{CUDA_HOME} /usr/local/cuda)
  find_path(DIST_NCCL_INCLUDE_DIR nccl.h HINTS ${_dist_cuda_hints} PATH_SUFFIXES include)
  find_path(DIST_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${_dist_cuda_hints} PATH_SUFFIXES include)
  find_library(DIST_NCCL_LIBRARY nccl HINTS ${_dist_cuda_hints} PATH_SUFFIXES lib64 lib)
  find_library(DIST_CUDART_LIBRARY cudart HINTS ${_dist_cuda_hints} PATH_SUFFIXES lib64 lib)
  if(DIST_NCCL_INCLUDE_DIR AND DIST_CUDART_INCLUDE_DIR AND DIST_NCCL_LIBRARY AND DIST_CUDART_LIBRARY)
    set(DIST_NCCL_ENABLED ON)
    add_library(Dist::nccl INTERFACE IMPORTED)
    set_target_properties(Dist::nccl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${DIST_NCCL_INCLUDE_DIR};${DIST_CUDART_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${DIST_NCCL_LIBRARY};${DIST_CUDART_LIBRARY}")
  elseif(_dist_nccl_mode STREQUAL "ON")
    message(FATAL_ERROR "DIST_WITH_NCCL=ON but CUDA runtime and NCCL were not found "
                        "(looked in CUDA_HOME and /usr/local/cuda); use AUTO or OFF")
  endif()
endif()
