# Builds and runs tests/package/consumer against kvpage one way (cmake -P, run by CTest):
#   -DMODE=find_package  install KVPAGE_BUILD to a temporary prefix, move the prefix, then
#                        find_package(kvpage) from it; the moved kvpage CLI must run `plan`
#                        and `sim` (bundled trace by bare name) and not name the source tree;
#                        kvpage.pc alone builds consumer_pkgconfig.cc; docs/install.md lists
#                        every installed library; a consumer without the CUDA toolkit finds
#                        kvpage (and `COMPONENTS cuda` fails).
#   -DMODE=subdirectory  add_subdirectory(KVPAGE_CHECKOUT) from the consumer; builds and runs
#                        the model-layer program only (the whole library would double the
#                        test's time).
#   -DMODE=fetchcontent  FetchContent from KVPAGE_CHECKOUT (configure and generate only).
# Other inputs: KVPAGE_CHECKOUT, KVPAGE_BUILD, WORK (emptied first), GENERATOR, CXX_COMPILER,
# BUILD_TYPE, LAUNCHER (optional compiler launcher, e.g. ccache).
cmake_minimum_required(VERSION 3.25)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

function(expect_output pattern)
  if(NOT run_output MATCHES "${pattern}")
    message(FATAL_ERROR "output lacks '${pattern}':\n${run_output}")
  endif()
endfunction()

# docs/install.md's list of installed libraries names every lib/libkvpage_*.a installed.
function(check_documented_libraries pc_file)
  get_filename_component(libdir ${pc_file} DIRECTORY)
  get_filename_component(libdir ${libdir} DIRECTORY)
  file(GLOB libs RELATIVE ${libdir} ${libdir}/libkvpage_*.a ${libdir}/libkvpage_*.so)
  file(READ ${KVPAGE_CHECKOUT}/docs/install.md doc)
  if(NOT doc MATCHES "lib/libkvpage_{([a-z_,]+)}")
    message(FATAL_ERROR "docs/install.md has no lib/libkvpage_{...} list")
  endif()
  string(REPLACE "," ";" documented "${CMAKE_MATCH_1}")
  foreach(lib IN LISTS libs)
    string(REGEX REPLACE "^libkvpage_(.*)\\.(a|so)$" "\\1" name ${lib})
    if(NOT name IN_LIST documented)
      message(FATAL_ERROR "docs/install.md does not list the installed ${lib}")
    endif()
  endforeach()
endfunction()

# kvpage.pc alone builds and links consumer_pkgconfig.cc (scheduler, block, model, kernel_ref).
function(build_with_pkg_config pc_file)
  find_program(PKG_CONFIG pkg-config)
  if(NOT PKG_CONFIG)
    message(STATUS "pkg-config not found: kvpage.pc not checked")
    return()
  endif()
  get_filename_component(pc_dir ${pc_file} DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} ${pc_dir})
  run(${PKG_CONFIG} --cflags --libs kvpage)
  separate_arguments(flags UNIX_COMMAND "${run_output}")
  run(${CXX_COMPILER} -std=c++20 ${KVPAGE_CHECKOUT}/tests/package/consumer/consumer_pkgconfig.cc
      ${flags} -o ${WORK}/consumer_pkgconfig)
  run(${WORK}/consumer_pkgconfig)
  expect_output("consumer_pkgconfig ok")
  message(STATUS "${run_output}")
endfunction()

# The CUDA targets are optional in the package: a consumer without the CUDA toolkit (here
# CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit) finds kvpage::kvpage in an install built with them,
# and `COMPONENTS cuda` fails without the toolkit or on an install built without CUDA.
function(check_cuda_component)
  file(GLOB cuda_targets ${prefix}/lib*/cmake/kvpage/kvpageCudaTargets.cmake
                         ${prefix}/lib/*/cmake/kvpage/kvpageCudaTargets.cmake)
  set(args ${configure_args} -DKVPAGE_REQUIRE_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${KVPAGE_CHECKOUT}/tests/package/consumer
                          -B ${WORK}/build-cuda-required ${args}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "find_package(kvpage COMPONENTS cuda) succeeded without CUDA:\n${out}")
  endif()
  if(NOT cuda_targets)
    message(STATUS "kvpage built without CUDA: the CPU-only consumer is the main check")
    return()
  endif()
  run(${CMAKE_COMMAND} -S ${KVPAGE_CHECKOUT}/tests/package/consumer -B ${WORK}/build-no-cuda
      ${configure_args} -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
  run(${CMAKE_COMMAND} --build ${WORK}/build-no-cuda --target consumer_model -j 2)
  run(${WORK}/build-no-cuda/consumer_model)
  expect_output("consumer_model ok")
  message(STATUS "without the CUDA toolkit: ${run_output}")
endfunction()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(configure_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DKVPAGE_CONSUME=${MODE})
if(LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${KVPAGE_BUILD} --prefix ${WORK}/prefix --strip)
  # Nothing in the package may depend on where it was installed.
  file(RENAME ${WORK}/prefix ${WORK}/moved)
  set(prefix ${WORK}/moved)
  foreach(file include/kvpage/scheduler.h include/kvpage/memory_backing.h
               include/kvpage/sim/simulator.h
               lib/cmake/kvpage/kvpageConfig.cmake lib/cmake/kvpage/kvpageConfigVersion.cmake
               share/kvpage/scripts/plot_plan.py share/kvpage/scripts/plot_sim.py
               share/kvpage/traces/mooncake_conversation_trace.jsonl)
    if(NOT EXISTS ${prefix}/${file})
      message(FATAL_ERROR "not installed: ${file}")
    endif()
  endforeach()
  foreach(file include/kvpage/prefetch.h include/kvpage/huge_page_allocator.h
               include/kvpage/step_phases.h include/kvpage/block_pool.h
               include/kvpage/memory_budget.h include/kvpage/request_block_hashes.h)
    if(EXISTS ${prefix}/${file})
      message(FATAL_ERROR "internal header installed: ${file}")
    endif()
  endforeach()
  file(GLOB pc_files ${prefix}/lib*/pkgconfig/kvpage.pc ${prefix}/lib/*/pkgconfig/kvpage.pc)
  if(NOT pc_files)
    message(FATAL_ERROR "kvpage.pc not installed")
  endif()
  list(GET pc_files 0 pc_file)
  check_documented_libraries(${pc_file})
  build_with_pkg_config(${pc_file})
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${prefix})
  check_cuda_component()

  # The CLI: from the moved prefix, in a directory without the trace, with no override.
  unset(ENV{KVPAGE_DATA_DIR})
  set(cli ${prefix}/bin/kvpage)
  file(STRINGS ${cli} source_paths REGEX "/sim/data|/scripts/")
  foreach(line IN LISTS source_paths)
    string(FIND "${line}" "${KVPAGE_CHECKOUT}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "the installed CLI names the source tree: ${line}")
    endif()
  endforeach()
  execute_process(COMMAND ${cli} plan --model qwen3-8b --context 4K --gpu h100
                  WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE run_output
                  ERROR_VARIABLE run_output)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvpage plan failed (${rc}):\n${run_output}")
  endif()
  expect_output("qwen3-8b")
  execute_process(COMMAND ${cli} sim --model qwen3-8b --gpu h100 --no-progress
                          --trace mooncake_conversation_trace.jsonl --max-requests 20
                  WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE run_output
                  ERROR_VARIABLE run_output)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvpage sim failed (${rc}):\n${run_output}")
  endif()
  set(targets consumer consumer_model)
elseif(MODE STREQUAL "subdirectory")
  list(APPEND configure_args -DKVPAGE_CHECKOUT=${KVPAGE_CHECKOUT})
  set(targets consumer_model)
else()
  # FetchContent ends in the same add_subdirectory: configuring and generating (every path,
  # the bundled files, the kvpage:: names the consumer links) is what differs, and it is
  # checked without compiling the library a third time.
  list(APPEND configure_args -DKVPAGE_CHECKOUT=${KVPAGE_CHECKOUT})
  set(targets "")
endif()

run(${CMAKE_COMMAND} -S ${KVPAGE_CHECKOUT}/tests/package/consumer -B ${WORK}/build
    ${configure_args})
foreach(target IN LISTS targets)
  run(${CMAKE_COMMAND} --build ${WORK}/build --target ${target} -j 2)
  run(${WORK}/build/${target})
  expect_output("${target} ok")
  message(STATUS "${run_output}")
endforeach()
