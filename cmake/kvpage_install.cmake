# Install rules and the kvpage CMake package (included by the top-level CMakeLists.txt when
# KVPAGE_INSTALL is on).
#
#   <prefix>/include/kvpage/          public headers (cuda/ only when the kernels are built)
#   <prefix>/include/kvpage/sim/      simulator headers, included as "sim/<name>.h"
#   <prefix>/lib/libkvpage_*.a        one library per layer
#   <prefix>/lib/cmake/kvpage/        kvpageConfig.cmake, version file, exported targets
#                                     (kvpageCudaTargets.cmake: the CUDA ones, when built)
#   <prefix>/lib/pkgconfig/kvpage.pc  the core library and kernel_ref for pkg-config
#   <prefix>/bin/kvpage               the CLI
#   <prefix>/share/kvpage/            its plot scripts, traces, model and GPU files
include(CMakePackageConfigHelpers)

set(KVPAGE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvpage CACHE STRING
    "Where kvpageConfig.cmake is installed, relative to the prefix")

# include/kvpage/ holds the public headers only (cmake/check_layering.cmake keeps them from
# including the sources); the CUDA ones, under cuda/, only when the kernels are built.
set(_kvpage_header_excludes "")
if(NOT TARGET kvpage_cuda)
  list(APPEND _kvpage_header_excludes PATTERN cuda EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvpage
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT kvpage_development
        FILES_MATCHING PATTERN *.h ${_kvpage_header_excludes})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/sim/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvpage/sim
        COMPONENT kvpage_development
        FILES_MATCHING PATTERN *.h PATTERN data EXCLUDE)

# Two export sets: the CUDA targets name CUDA::* targets, which only a consumer with the
# toolkit can resolve, so kvpageConfig.cmake loads kvpageCudaTargets.cmake only where
# find_package(CUDAToolkit) succeeds (or the `cuda` component is required).
set(_kvpage_export_sets kvpageTargets)
set(kvpageTargets_targets
    kvpage kvpage_model kvpage_block kvpage_scheduler kvpage_planner kvpage_memory kvpage_sim
    kvpage_kernel_ref kvpage_events)
if(TARGET kvpage_cuda)
  list(APPEND _kvpage_export_sets kvpageCudaTargets)
  set(kvpageCudaTargets_targets kvpage_cuda kvpage_memory_cuda kvpage_device)
endif()
foreach(_set IN LISTS _kvpage_export_sets)
  install(TARGETS ${${_set}_targets}
          EXPORT ${_set}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kvpage_development
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kvpage_runtime
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvpage_runtime
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT ${_set}
          NAMESPACE kvpage::
          DESTINATION ${KVPAGE_INSTALL_CMAKEDIR}
          COMPONENT kvpage_development)
endforeach()

set(KVPAGE_CONFIG_WITH_CUDA OFF)
if(TARGET kvpage_cuda)
  set(KVPAGE_CONFIG_WITH_CUDA ON)
endif()
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/kvpageConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvpageConfig.cmake
  INSTALL_DESTINATION ${KVPAGE_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/kvpageConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvpageConfig.cmake
              ${PROJECT_BINARY_DIR}/kvpageConfigVersion.cmake
        DESTINATION ${KVPAGE_INSTALL_CMAKEDIR}
        COMPONENT kvpage_development)

# pkg-config: the core library (model, block, scheduler, planner, memory) and the kernels' CPU
# references (kernel_ref), static link order.
# Static libraries cannot carry their private dependencies: list them as link requirements.
if(BUILD_SHARED_LIBS)
  set(KVPAGE_PC_LINK_DEPS "")
  set(KVPAGE_PC_PRIVATE_DEPS "libcrypto libxxhash")
else()
  set(KVPAGE_PC_LINK_DEPS "libcrypto libxxhash")
  set(KVPAGE_PC_PRIVATE_DEPS "")
endif()
file(RELATIVE_PATH KVPAGE_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" KVPAGE_PC_TO_PREFIX "${KVPAGE_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvpage.pc.in ${PROJECT_BINARY_DIR}/kvpage.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvpage.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT kvpage_development)

if(TARGET kvpage_cli)
  install(TARGETS kvpage_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvpage_runtime)
  # What the CLI reads at run time, found relative to bin/ (see cli/cli_util.h).
  set(_kvpage_share ${CMAKE_INSTALL_DATADIR}/kvpage)
  install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/plot_plan.py ${PROJECT_SOURCE_DIR}/scripts/plot_sim.py
                   ${PROJECT_SOURCE_DIR}/scripts/plot_slo.py
          DESTINATION ${_kvpage_share}/scripts COMPONENT kvpage_runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/sim/data/traces/
          DESTINATION ${_kvpage_share}/traces COMPONENT kvpage_runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/sim/data/models/
          DESTINATION ${_kvpage_share}/models COMPONENT kvpage_runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/sim/data/hardware/
          DESTINATION ${_kvpage_share}/hardware COMPONENT kvpage_runtime)
endif()
