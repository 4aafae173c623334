# Finds Debian's LLVM/MLIR 22 and makes every MLIR target link LLVM's static
# component archives instead of the shared libLLVM.so that Debian's config
# names (LLVM_LINK_LLVM_DYLIB=ON). The result is one self-contained
# libflashjit.so that needs only libc/libm on the GPU machine.
find_package(MLIR REQUIRED CONFIG)
message(STATUS "Using MLIR ${LLVM_PACKAGE_VERSION} from ${MLIR_DIR}")

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
include(TableGen)
include(AddLLVM)
include(AddMLIR)

include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
add_definitions(${LLVM_DEFINITIONS})

# The LLVM components flashjit needs: IR, the optimiser, the NVPTX backend
# (PTX for the GPU) and the X86 backend + ORC JIT (the CPU execution mode).
llvm_map_components_to_libnames(FLASHJIT_LLVM_COMPONENT_LIBS
  Core Support IRReader IRPrinter Passes Linker ipo TransformUtils Analysis
  Target TargetParser MC BitReader BitWriter AsmParser Object
  NVPTXCodeGen NVPTXDesc NVPTXInfo
  X86CodeGen X86AsmParser X86Desc X86Info
  OrcJIT ExecutionEngine JITLink RuntimeDyld PerfJITEvents)

# A few MLIR targets (MLIRExecutionEngine) name the whole libMLIR.so as a
# dependency; linking it beside the static archives would give two copies of
# MLIR's registries in one process. Name their static dependencies instead.
set(FLASHJIT_MLIR_DYLIB_REPLACEMENT
  MLIRBuiltinToLLVMIRTranslation MLIRExecutionEngineUtils MLIRLLVMDialect
  MLIRLLVMToLLVMIRTranslation MLIRTargetLLVMIRExport MLIRIR MLIRSupport)

add_library(flashjit_mlir_static INTERFACE)
target_link_libraries(flashjit_mlir_static INTERFACE
  ${FLASHJIT_MLIR_DYLIB_REPLACEMENT})

# Static zlib/zstd instead of the shared ones, and no z3.
add_library(flashjit_llvm_static INTERFACE)
target_link_libraries(flashjit_llvm_static INTERFACE ${FLASHJIT_LLVM_COMPONENT_LIBS})
if(TARGET LLVMSupport)
  set_property(TARGET LLVMSupport PROPERTY INTERFACE_LINK_LIBRARIES
    "rt;dl;m;pthread;/usr/lib/x86_64-linux-gnu/libz.a;/usr/lib/x86_64-linux-gnu/libzstd.a;LLVMDemangle")
endif()

# Replace the "LLVM" and "MLIR" dylib dependencies in every MLIR target.
foreach(tgt IN LISTS MLIR_EXPORTED_TARGETS)
  if(TARGET ${tgt})
    get_target_property(_type ${tgt} TYPE)
    if(_type STREQUAL "STATIC_LIBRARY" OR _type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(_libs ${tgt} INTERFACE_LINK_LIBRARIES)
      if(_libs)
        list(TRANSFORM _libs REPLACE "^LLVM$" "flashjit_llvm_static")
        list(TRANSFORM _libs REPLACE "^MLIR$" "flashjit_mlir_static")
        set_property(TARGET ${tgt} PROPERTY INTERFACE_LINK_LIBRARIES "${_libs}")
      endif()
    endif()
  endif()
endforeach()

# Options for every target that links LLVM/MLIR statically.
# Debian builds LLVM with RTTI on and exceptions off.
