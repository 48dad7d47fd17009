# Resolves DIST_WITH_NCCL (AUTO | ON | OFF) into DIST_NCCL_ENABLED: CUDA through
# find_package(CUDAToolkit) (CUDAToolkit_ROOT, CUDA_HOME, nvcc on PATH, /usr/local/cuda), NCCL
# through FindNCCL (NCCL_ROOT, next to the toolkit). When enabled, CUDA::cudart and NCCL::nccl
# exist, and DIST_CUDA_LANGUAGE says whether nvcc works here (the GPU tests' kernels need it).
set(DIST_NCCL_ENABLED OFF)
set(DIST_CUDA_LANGUAGE OFF)
string(TOUPPER "${DIST_WITH_NCCL}" _dist_nccl_mode)
if(NOT _dist_nccl_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DIST_WITH_NCCL must be AUTO, ON or OFF (got '${DIST_WITH_NCCL}')")
endif()

if(NOT _dist_nccl_mode STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND DEFINED ENV{CUDA_HOME})
    set(CUDAToolkit_ROOT "$ENV{CUDA_HOME}")
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_package(NCCL QUIET)
  endif()
  if(CUDAToolkit_FOUND AND NCCL_FOUND)
    set(DIST_NCCL_ENABLED ON)
    message(STATUS "NCCL backend: CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_LIBRARY_DIR}), "
                   "NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # The test kernels are tiny: a generic PTX that every GPU since Turing compiles at load time,
      # plus Hopper's machine code. Set CMAKE_CUDA_ARCHITECTURES to build for others.
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 75-virtual 90-real)
      endif()
      enable_language(CUDA)
      set(DIST_CUDA_LANGUAGE ON)
    endif()
  elseif(_dist_nccl_mode STREQUAL "ON")
    message(FATAL_ERROR
      "DIST_WITH_NCCL=ON but the CUDA toolkit (found: ${CUDAToolkit_FOUND}) or NCCL (found: "
      "${NCCL_FOUND}) is missing. Point CUDAToolkit_ROOT (or CUDA_HOME) at the toolkit and "
      "NCCL_ROOT at NCCL, or use DIST_WITH_NCCL=AUTO or OFF")
  endif()
endif()
