# dist_target_warnings(<target>): the project's own code builds with these warnings as errors.
# Third-party headers come in through imported targets, which CMake marks as SYSTEM includes.
# They apply to C++ sources only: nvcc has its own flags (the GPU tests' kernels).
function(dist_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>)
  # GCC 12 reports -Wrestrict false positives inside libstdc++'s std::string concatenation
  # (GCC bug 105329); the warning is not about our code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
endfunction()
