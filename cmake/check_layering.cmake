# Checks kvpage's layering (cmake -DSOURCE_DIR=<checkout> -P check_layering.cmake; a CTest
# test runs it): every #include "..." of a layer's sources and public headers names a header
# of the same layer or of one below it.
#
#   model <- block <- scheduler <- sim        planner -> block, model      memory -> block
#   kernels (src/kernels_ref, kernels/) -> model only         internal: any layer may use it
#   device (src/device: the step's tables on the GPU) -> scheduler, kernels
#   events (src/events: KV events on the wire, their publisher) -> block; sim may use it
#   cli (cli/: the kvpage command line, an application) -> the library and sim
#   python (python/src: the Python module) -> the library, sim and cli (whose commands it runs)
# Nothing under src/ includes sim/ or cli/: a file in a folder no layer names yet is checked
# against the library's layers as a whole.
cmake_minimum_required(VERSION 3.25)

set(allowed_model model internal)
set(allowed_block model block internal)
set(allowed_scheduler model block scheduler internal)
set(allowed_planner model block planner internal)
set(allowed_sim model block scheduler events sim internal)
set(allowed_memory model block memory internal)
set(allowed_kernels model kernels internal)
set(allowed_device model block scheduler kernels device internal)
set(allowed_events model block events internal)
set(allowed_internal internal)
set(allowed_cli model block scheduler planner sim events memory internal cli)
set(allowed_python model block scheduler planner sim events memory internal cli)
set(allowed_library model block scheduler planner kernels memory device events internal)

# The layer of each public header in include/kvpage/.
set(public_model dtype model_spec catalog vllm_version tensor_parallel checkpoint)
set(public_block types block_hash memory_backing memory_layout kv_events kv_cache_manager)
set(public_memory host_memory_backing cuda_vmm_backing)
set(public_scheduler scheduler step_image metrics)
set(public_planner planner plan_format vllm_runtime_memory)
set(public_kernels kernel_layout kernel_reference)
set(public_device cuda/device_step_tables)
set(public_events kv_event_wire kv_event_publisher)

# Sets ${out} to the layer of the included path, or "" for a header outside kvpage.
function(layer_of_include path out)
  set(layer "")
  if(path MATCHES "^kvpage/cuda/device_step_tables\\.h$")
    set(layer device)
  elseif(path MATCHES "^kvpage/cuda/")
    set(layer kernels)
  elseif(path MATCHES "^kvpage/([a-z_0-9]+)\\.h$")
    set(name ${CMAKE_MATCH_1})
    foreach(candidate model block scheduler planner kernels memory device events)
      if(name IN_LIST public_${candidate})
        set(layer ${candidate})
      endif()
    endforeach()
    if(NOT layer)
      message(SEND_ERROR "include/kvpage/${name}.h has no layer: add it to cmake/check_layering.cmake")
    endif()
  elseif(path MATCHES "^(src/)?(internal|profile)/")
    set(layer internal)
  elseif(path MATCHES "^(model|block|scheduler|planner|sim|kernels|memory|device|events)/")
    set(layer ${CMAKE_MATCH_1})
  elseif(path MATCHES "^cli/")
    set(layer cli)
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

set(violations "")
function(check_files layer)
  foreach(file IN LISTS ARGN)
    file(STRINGS ${file} includes REGEX "^#include \"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
      layer_of_include(${path} included)
      if(included AND NOT included IN_LIST allowed_${layer})
        file(RELATIVE_PATH rel ${SOURCE_DIR} ${file})
        string(APPEND violations "  ${rel} (${layer}) includes ${path} (${included})\n")
      endif()
    endforeach()
  endforeach()
  set(violations "${violations}" PARENT_SCOPE)
endfunction()

foreach(layer model block scheduler planner memory device events internal)
  file(GLOB_RECURSE files ${SOURCE_DIR}/src/${layer}/*.h ${SOURCE_DIR}/src/${layer}/*.cc)
  check_files(${layer} ${files})
  list(APPEND src_checked ${files})
endforeach()
file(GLOB files ${SOURCE_DIR}/src/profile/*.h ${SOURCE_DIR}/src/profile/*.cc)
check_files(internal ${files})
list(APPEND src_checked ${files})
file(GLOB files ${SOURCE_DIR}/sim/*.h ${SOURCE_DIR}/sim/*.cc)
check_files(sim ${files})
file(GLOB_RECURSE files ${SOURCE_DIR}/src/kernels_ref/*.cc ${SOURCE_DIR}/kernels/*.h
     ${SOURCE_DIR}/kernels/*.cc ${SOURCE_DIR}/kernels/*.cuh ${SOURCE_DIR}/kernels/*.cu)
check_files(kernels ${files})
list(APPEND src_checked ${files})
# Every other file under src/ (a folder no layer above names): no arrow up to sim/ or cli/.
file(GLOB_RECURSE files ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cc ${SOURCE_DIR}/src/*.cu
     ${SOURCE_DIR}/src/*.cuh)
list(REMOVE_ITEM files ${src_checked})
check_files(library ${files})
file(GLOB_RECURSE files ${SOURCE_DIR}/cli/*.h ${SOURCE_DIR}/cli/*.cc)
check_files(cli ${files})
file(GLOB files ${SOURCE_DIR}/python/src/*.h ${SOURCE_DIR}/python/src/*.cc)
check_files(python ${files})
# Each public header in its layer (include/kvpage/cuda/: kernels, but device_step_tables.h:
# device).
file(GLOB files ${SOURCE_DIR}/include/kvpage/*.h ${SOURCE_DIR}/include/kvpage/cuda/*.h)
foreach(file IN LISTS files)
  file(RELATIVE_PATH name ${SOURCE_DIR}/include ${file})
  layer_of_include(${name} layer)
  if(layer)
    check_files(${layer} ${file})
  endif()
endforeach()

# ---- include/ -> only include/ ------------------------------------------------------------
# A public header is what a user compiles against an installed kvpage: it may include other
# public headers ("kvpage/<name>.h", which must exist under include/) and the standard library
# or third-party headers (<...>, "absl/..."), never a file of the library's sources ("src/...",
# "internal/...", "block/...", "sim/...": anything else).
set(public_include_third_party absl)
file(GLOB_RECURSE files ${SOURCE_DIR}/include/*)
foreach(file IN LISTS files)
  file(RELATIVE_PATH rel ${SOURCE_DIR} ${file})
  file(STRINGS ${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*([\"<])([^\">]+)[\">].*" "\\1;\\2"
           parts "${line}")
    list(GET parts 0 delimiter)
    list(GET parts 1 path)
    string(REGEX REPLACE "/.*" "" top "${path}")
    if(path MATCHES "^kvpage/")
      if(NOT EXISTS ${SOURCE_DIR}/include/${path})
        string(APPEND violations "  ${rel} includes ${path} (not a header under include/)\n")
      endif()
    elseif(delimiter STREQUAL "\"" AND NOT top IN_LIST public_include_third_party)
      string(APPEND violations "  ${rel} includes ${path} (outside include/)\n")
    elseif(path MATCHES "/" AND (EXISTS ${SOURCE_DIR}/${top} OR EXISTS ${SOURCE_DIR}/src/${top}))
      string(APPEND violations "  ${rel} includes <${path}> (outside include/)\n")
    endif()
  endforeach()
endforeach()

if(violations)
  message(FATAL_ERROR "includes against the layering:\n${violations}")
endif()
message(STATUS "layering ok")
