# dist_target_warnings(<target>): the project's own code builds with these warnings as errors.
# Third-party headers come in through imported targets, which CMake marks as SYSTEM includes.
# CUDA sources: nvcc's own warnings and the host compiler's (on nvcc's generated host code, so
# without -Wpedantic), all as errors.
function(dist_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
  # GCC 12 reports -Wrestrict false positives inside libstdc++'s std::string concatenation
  # (GCC bug 105329); the warning is not about our code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
endfunction()
