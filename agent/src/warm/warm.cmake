# --warm-restart and snapshots (agent/src/warm/, listed with dist_agent's other rooms): the Python
# files the agent writes out at run time are compiled in (embed_python.cmake), so an installed
# dist-launch needs no Python package next to it.
set(_dist_warm_python ${PROJECT_SOURCE_DIR}/python/dist_launch)
set(_dist_warm_header ${CMAKE_CURRENT_BINARY_DIR}/warm_generated/warm_python_sources.h)
set(_dist_warm_inputs "kZygote=${_dist_warm_python}/_zygote.py|kSnapshot=${_dist_warm_python}/snapshot.py|kStandInPackage=${_dist_warm_python}/_stand_in.py|kElastic=${_dist_warm_python}/elastic.py|kFunctionWorker=${_dist_warm_python}/_function_worker.py|kSockets=${_dist_warm_python}/_sockets.py")
add_custom_command(OUTPUT ${_dist_warm_header}
  COMMAND ${CMAKE_COMMAND} -DOUTPUT=${_dist_warm_header} "-DINPUTS=${_dist_warm_inputs}"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/src/warm/embed_python.cmake
  DEPENDS ${_dist_warm_python}/_zygote.py ${_dist_warm_python}/snapshot.py
          ${_dist_warm_python}/_stand_in.py ${_dist_warm_python}/elastic.py
          ${_dist_warm_python}/_function_worker.py ${_dist_warm_python}/_sockets.py
          ${CMAKE_CURRENT_SOURCE_DIR}/src/warm/embed_python.cmake
  COMMENT "Embedding the zygote and the dist_launch stand-in (snapshot, elastic)"
  VERBATIM)
target_sources(dist_agent PRIVATE ${_dist_warm_header})
target_include_directories(dist_agent PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/warm_generated)
