# The on-disk cache's tests (runtime/DiskCache.*). Included from
# tests/unit/runtime/CMakeLists.txt with
#   include(${CMAKE_CURRENT_SOURCE_DIR}/CacheTests.cmake)
#
# flashjit-cache-tests: needs no GPU; forks real processes to check that
# concurrent writers and readers never corrupt the cache.
find_package(GTest REQUIRED)
include(GoogleTest)

# runtime/DiskCache.cpp belongs to flashjit_runtime; until runtime/
# CMakeLists.txt lists it, add it here (once, whichever way it is spelled).
get_target_property(_flashjit_runtime_sources flashjit_runtime SOURCES)
if(NOT "DiskCache.cpp" IN_LIST _flashjit_runtime_sources AND
   NOT "${CMAKE_SOURCE_DIR}/runtime/DiskCache.cpp" IN_LIST
       _flashjit_runtime_sources)
  target_sources(flashjit_runtime PRIVATE
    ${CMAKE_SOURCE_DIR}/runtime/DiskCache.cpp)
endif()
unset(_flashjit_runtime_sources)

add_executable(flashjit-cache-tests
  ${CMAKE_CURRENT_LIST_DIR}/DiskCacheTests.cpp)
target_link_libraries(flashjit-cache-tests PRIVATE flashjit_runtime
  GTest::gtest_main)
gtest_discover_tests(flashjit-cache-tests
  PROPERTIES LABELS unit)
