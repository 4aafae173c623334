# The on-disk cache's tests (runtime/DiskCache.*). Included from
# tests/unit/runtime/CMakeLists.txt with
#   include(${CMAKE_CURRENT_SOURCE_DIR}/CacheTests.cmake)
#
# flashjit-cache-tests: needs no GPU; DiskCacheTests.cpp: directory, key,
# store/load, list/clear; DiskCacheIntegrityTests.cpp: damaged entries, and
# real forked processes that check that concurrent writers and readers never
# corrupt the cache.
find_package(GTest REQUIRED)
include(GoogleTest)

add_executable(flashjit-cache-tests
  ${CMAKE_CURRENT_LIST_DIR}/DiskCacheTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/DiskCacheIntegrityTests.cpp)
target_link_libraries(flashjit-cache-tests PRIVATE flashjit_runtime
  GTest::gtest_main)
gtest_discover_tests(flashjit-cache-tests
  PROPERTIES LABELS unit)
