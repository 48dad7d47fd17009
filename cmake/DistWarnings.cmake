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

# A unity build (CMAKE_UNITY_BUILD, as scripts/demo.sh builds) includes several .cc files into one:
# GCC then takes a type of one .cc that uses its anonymous namespace for a type "defined in a
# header", a false -Wsubobject-linkage. Each .cc builds on its own, every warning on, by default.
if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
endif()
