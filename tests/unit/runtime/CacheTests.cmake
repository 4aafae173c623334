# The on-disk cache's tests (runtime/DiskCache.*). Included from
# tests/unit/runtime/CMakeLists.txt with
#   include(${CMAKE_CURRENT_SOURCE_DIR}/CacheTests.cmake)
#
# flashjit-cache-tests: needs no GPU; forks real processes to check that
# concurrent writers and readers never corrupt the cache.
find_package(GTest REQUIRED)
include(GoogleTest)

add_executable(flashjit-cache-tests
  ${CMAKE_CURRENT_LIST_DIR}/DiskCacheTests.cpp)
target_link_libraries(flashjit-cache-tests PRIVATE flashjit_runtime
  GTest::gtest_main)
gtest_discover_tests(flashjit-cache-tests
  PROPERTIES LABELS unit)
