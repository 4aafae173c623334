# The C API (tools/capi/flashjit.h) through libflashjit.so: include this from
# tests/unit/CMakeLists.txt. The test sees only the .so's flashjit_* symbols;
# the inputs and the float64 reference come from the static flashjit_kernels
# library (its copy inside the .so is hidden, so the two never meet).
# CApiSmoke.c is plain C: it proves the header compiles as C.
# CApiErrorTests.cpp: the errors and their messages (CApiTests.cpp has main).
# CApiPlanTests.cpp: the prepared forward calls (flashjit_plan_*).
# CApiCapturedTests.cpp: captured tensors (flashjit_forward_captured).
# CApiVarlenTests.cpp: variable-length batches (flashjit_forward_varlen).
# CApiBlockSparseTests.cpp: the block-sparse backward (flashjit_backward_kv_major).
add_executable(flashjit-capi-tests
  ${CMAKE_CURRENT_LIST_DIR}/CApiTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/CApiErrorTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/CApiPlanTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/CApiCapturedTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/CApiVarlenTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/CApiBlockSparseTests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/CApiSmoke.c)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/CApiSmoke.c PROPERTIES
  COMPILE_OPTIONS "-std=c99;-Wall;-Wextra;-pedantic")
target_link_libraries(flashjit-capi-tests PRIVATE flashjit flashjit_kernels
  GTest::gtest m)
gtest_discover_tests(flashjit-capi-tests PROPERTIES LABELS "unit"
  DISCOVERY_TIMEOUT 60)
