//===- RuntimeTests.cpp - Runtime tests that need no GPU ------------------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What the runtime does on a machine without a GPU: report the missing
/// driver clearly, turn PTX into cubins with nvJitLink, and read ptxas's
/// resource report. Kernel launches are tested in tests/gpu/.
///
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "runtime/NvJitLink.h"
#include "tests/unit/runtime/TestKernels.h"

#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <regex>

using namespace flashjit::rt;

namespace {

using flashjit::test::ScopedEnv;

bool isElf(const std::vector<char> &image) {
  return image.size() > 4 && std::memcmp(image.data(),
                                         "\x7f"
                                         "ELF",
                                         4) == 0;
}

/// Runs \p fn, expects a RuntimeError of \p code, returns its message.
template <typename Fn> std::string expectError(ErrorCode code, Fn &&fn) {
  try {
    fn();
  } catch (const RuntimeError &e) {
    EXPECT_EQ(errorCodeName(e.code()), std::string(errorCodeName(code)))
        << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a RuntimeError(" << errorCodeName(code) << ")";
  return {};
}

} // namespace

//===----------------------------------------------------------------------===//
// CudaDriver without a driver
//===----------------------------------------------------------------------===//

TEST(CudaDriver, MissingLibraryIsReportedNotThrown) {
  CudaDriver driver("/nonexistent/libcuda.so.1");
  EXPECT_FALSE(driver.available());
  EXPECT_NE(driver.unavailableReason().find("no CUDA driver"),
            std::string::npos)
      << driver.unavailableReason();
  EXPECT_NE(driver.unavailableReason().find(
                "dlopen(/nonexistent/libcuda.so.1) failed"),
            std::string::npos)
      << driver.unavailableReason();
  EXPECT_EQ(driver.libraryPath(), "/nonexistent/libcuda.so.1");
}

TEST(CudaDriver, EveryCallThrowsNoDriver) {
  CudaDriver driver("/nonexistent/libcuda.so.1");
  std::string message =
      expectError(ErrorCode::NoDriver, [&] { driver.requireAvailable(); });
  EXPECT_NE(message.find("no CUDA driver"), std::string::npos);
  expectError(ErrorCode::NoDriver, [&] { driver.ensureContext(); });
  expectError(ErrorCode::NoDriver, [&] { driver.deviceCount(); });
  expectError(ErrorCode::NoDriver, [&] { queryDevice(0, driver); });
  expectError(ErrorCode::NoDriver, [&] { DeviceBuffer buffer(64, driver); });
  expectError(ErrorCode::NoDriver, [&] { EventTimer timer(driver); });
  expectError(ErrorCode::NoDriver, [&] {
    Module module(std::string(test::kTestKernelsPtx), driver);
  });
  expectError(ErrorCode::NoDriver, [&] { isStreamCapturing(nullptr, driver); });
  expectError(ErrorCode::NoDriver, [&] { Event event(driver); });
  char host[8] = {};
  expectError(ErrorCode::NoDriver,
              [&] { copyToHostAsync(host, 0x1000, 8, nullptr, driver); });
  expectError(ErrorCode::NoDriver,
              [&] { copyToDeviceAsync(0x1000, host, 8, nullptr, driver); });
}

TEST(CudaDriver, StreamOrderedCopiesRejectNullPointersFirst) {
  CudaDriver driver("/nonexistent/libcuda.so.1");
  char host[8] = {};
  expectError(ErrorCode::InvalidArgument,
              [&] { copyToHostAsync(nullptr, 0x1000, 8, nullptr, driver); });
  expectError(ErrorCode::InvalidArgument,
              [&] { copyToDeviceAsync(0, host, 8, nullptr, driver); });
  // Nothing to copy: no driver call at all.
  copyToHostAsync(nullptr, 0, 0, nullptr, driver);
  copyToDeviceAsync(0, nullptr, 0, nullptr, driver);
}

TEST(CudaDriver, EnvironmentOverridesLibraryPath) {
  {
    ScopedEnv env("FLASHJIT_LIBCUDA", "/nonexistent/libcuda-test.so");
    EXPECT_EQ(CudaDriver::defaultLibraryPath(), "/nonexistent/libcuda-test.so");
    CudaDriver driver(CudaDriver::defaultLibraryPath());
    EXPECT_FALSE(driver.available());
    EXPECT_NE(driver.unavailableReason().find("no CUDA driver"),
              std::string::npos);
  }
  {
    ScopedEnv env("FLASHJIT_LIBCUDA", nullptr);
    EXPECT_EQ(CudaDriver::defaultLibraryPath(), "libcuda.so.1");
  }
}

TEST(CudaDriver, StubLibraryFailsInCuInit) {
  // The toolkit's stub exports every entry point but cannot initialise: the
  // driver must resolve all symbols (their names are right) and then report
  // cuInit's error by name.
  CudaDriver driver(FLASHJIT_CUDA_STUB_LIBCUDA);
  ASSERT_FALSE(driver.available());
  const std::string &reason = driver.unavailableReason();
  EXPECT_NE(reason.find("cuInit failed: CUDA_ERROR_STUB_LIBRARY"),
            std::string::npos)
      << reason;
}

TEST(CudaDriver, ProcessWideDriverExplainsItself) {
  CudaDriver &driver = CudaDriver::get();
  EXPECT_EQ(&driver, &CudaDriver::get());
  if (!driver.available())
    EXPECT_FALSE(driver.unavailableReason().empty());
  else
    EXPECT_TRUE(driver.unavailableReason().empty());
}

TEST(CudaDriver, InvalidLaunchArgumentsAreRejectedFirst) {
  CudaDriver driver("/nonexistent/libcuda.so.1");
  expectError(ErrorCode::InvalidArgument, [&] {
    launch(nullptr, {1, 1, 1}, {32, 1, 1}, 0, nullptr, nullptr, driver);
  });
  auto fakeFunction = reinterpret_cast<CUfunction>(0x1);
  std::string message = expectError(ErrorCode::InvalidArgument, [&] {
    launch(fakeFunction, {0, 1, 1}, {32, 1, 1}, 0, nullptr, nullptr, driver);
  });
  EXPECT_NE(message.find("grid=(0,1,1)"), std::string::npos) << message;
}

TEST(DeviceInfo, TargetArch) {
  EXPECT_EQ(targetArchFor(8, 0), "sm_80");
  EXPECT_EQ(targetArchFor(8, 6), "sm_86");
  EXPECT_EQ(targetArchFor(8, 9), "sm_89");
  EXPECT_EQ(targetArchFor(9, 0), "sm_90a");
  EXPECT_EQ(targetArchFor(10, 0), "sm_100a");
  EXPECT_EQ(targetArchFor(12, 0), "sm_120a");
  DeviceInfo info;
  info.ccMajor = 9;
  info.ccMinor = 0;
  EXPECT_EQ(info.targetArch(), "sm_90a");
  EXPECT_EQ(info.computeCapability(), 90);
}

//===----------------------------------------------------------------------===//
// nvJitLink
//===----------------------------------------------------------------------===//

TEST(NvJitLink, LoadsAndReportsVersion) {
  NvJitLink &nvJitLink = NvJitLink::get();
  ASSERT_TRUE(nvJitLink.available()) << nvJitLink.unavailableReason();
  std::string version = nvJitLinkVersionString();
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(\d+\.\d+)"))) << version;
  EXPECT_GE(nvJitLink.version().first, 12u);
}

TEST(NvJitLink, MissingLibraryIsReported) {
  NvJitLink nvJitLink({"/nonexistent/libnvJitLink.so.13"});
  EXPECT_FALSE(nvJitLink.available());
  EXPECT_NE(nvJitLink.unavailableReason().find("nvJitLink not found"),
            std::string::npos);
  std::string message = expectError(ErrorCode::NvJitLinkError, [&] {
    ptxToCubin(test::kTestKernelsPtx, "sm_80", {}, nvJitLink);
  });
  EXPECT_NE(message.find("/nonexistent/libnvJitLink.so.13"), std::string::npos);
}

TEST(NvJitLink, EnvironmentOverridesCandidates) {
  ScopedEnv env("FLASHJIT_NVJITLINK", "/nonexistent/nvjitlink-test.so");
  std::vector<std::string> candidates = NvJitLink::defaultCandidates();
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0], "/nonexistent/nvjitlink-test.so");
}

class PtxToCubin : public ::testing::TestWithParam<const char *> {};

TEST_P(PtxToCubin, CompilesVectorAdd) {
  const char *arch = GetParam();
  CubinResult result = ptxToCubin(test::kTestKernelsPtx, arch);
  ASSERT_TRUE(isElf(result.cubin)) << "not an ELF image";
  EXPECT_GT(result.cubin.size(), 512u);
  ASSERT_FALSE(result.infoLog.empty());
  EXPECT_NE(result.infoLog.find(arch), std::string::npos) << result.infoLog;

  ResourceUsage add = parseResourceUsage(result.infoLog, "vector_add");
  EXPECT_GT(add.registers, 0) << result.infoLog;
  EXPECT_FALSE(add.spills());
  EXPECT_EQ(add.barriers, 0);
  ResourceUsage roundtrip =
      parseResourceUsage(result.infoLog, "smem_roundtrip");
  EXPECT_GT(roundtrip.registers, 0) << result.infoLog;
  EXPECT_EQ(roundtrip.barriers, 1) << result.infoLog;
  // Dynamic shared memory is not part of the report; the sm_90a linker adds
  // 1 KiB to a kernel that uses shared memory.
  EXPECT_LE(roundtrip.sharedBytes, 1024);
  // One entry per kernel, although both reports name each.
  EXPECT_EQ(parseResourceUsagePerFunction(result.infoLog).size(), 2u)
      << result.infoLog;
  EXPECT_GT(parseResourceUsage(result.infoLog).registers, 0);

  // Compiling the same PTX again must report ptxas's numbers again (on a
  // machine with a driver, nvJitLink's cache would otherwise skip ptxas).
  CubinResult again = ptxToCubin(test::kTestKernelsPtx, arch);
  EXPECT_NE(again.infoLog.find("Compiling entry function 'vector_add'"),
            std::string::npos)
      << again.infoLog;
  EXPECT_NE(again.infoLog.find("bytes spill stores"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Archs, PtxToCubin,
                         ::testing::Values("sm_80", "sm_90a"));

TEST(NvJitLink, ReportsStaticSharedMemoryAndRegisterCap) {
  const char *ptx = R"ptx(
.version 8.0
.target sm_80
.address_size 64
.visible .entry with_smem(.param .u64 with_smem_param_out)
{
    .shared .align 16 .b8 buf[4096];
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 2;
    mov.u32 %r3, buf;
    add.s32 %r3, %r3, %r2;
    st.shared.u32 [%r3], %r1;
    bar.sync 0;
    ld.shared.u32 %r1, [%r3];
    ld.param.u64 %rd1, [with_smem_param_out];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r1;
    ret;
}
)ptx";
  for (const char *arch : {"sm_80", "sm_90a"}) {
    CubinResult result = ptxToCubin(ptx, arch, {"-maxrregcount=32"});
    ASSERT_TRUE(isElf(result.cubin));
    ResourceUsage usage = parseResourceUsage(result.infoLog, "with_smem");
    // ptxas reports the 4096 bytes declared; the sm_90a linked cubin holds
    // 1 KiB more (5120 with nvJitLink 13.0).
    if (std::string(arch) == "sm_80")
      EXPECT_EQ(usage.sharedBytes, 4096) << result.infoLog;
    else
      EXPECT_TRUE(usage.sharedBytes >= 4096 && usage.sharedBytes <= 5120)
          << result.infoLog;
    EXPECT_EQ(usage.barriers, 1);
    EXPECT_GT(usage.registers, 0);
    EXPECT_LE(usage.registers, 32);
  }
}

TEST(NvJitLink, SyntaxErrorCarriesTheErrorLog) {
  std::string message = expectError(ErrorCode::NvJitLinkError, [] {
    ptxToCubin(test::kBrokenPtx, "sm_90a");
  });
  // nvJitLink 13 compiles PTX inputs eagerly: nvJitLinkAddData (not
  // nvJitLinkComplete) is the call that fails.
  EXPECT_NE(message.find("failed: NVJITLINK_ERROR_PTX_COMPILE"),
            std::string::npos)
      << message;
  // The error log itself: ptxas names the line and the problem.
  EXPECT_NE(message.find("line 10"), std::string::npos) << message;
  EXPECT_NE(message.find("Arguments mismatch for instruction 'add'"),
            std::string::npos)
      << message;
}

TEST(NvJitLink, RejectsBadArguments) {
  expectError(ErrorCode::InvalidArgument, [] { ptxToCubin("", "sm_90a"); });
  expectError(ErrorCode::InvalidArgument,
              [] { ptxToCubin(test::kTestKernelsPtx, "90a"); });
  std::string message = expectError(ErrorCode::NvJitLinkError, [] {
    ptxToCubin(test::kTestKernelsPtx, "sm_9999");
  });
  EXPECT_NE(message.find("-arch=sm_9999"), std::string::npos) << message;
  expectError(ErrorCode::NvJitLinkError, [] {
    ptxToCubin(test::kTestKernelsPtx, "sm_90a", {"-no-such-option"});
  });
}

//===----------------------------------------------------------------------===//
// parseResourceUsage
//===----------------------------------------------------------------------===//

/// A verbose log of two kernels, one spilling, as nvJitLink 13.0 prints it:
/// ptxas's report, then the linker's (whose smem includes the 1 KiB that
/// sm_90a adds). Constant banks (cmem) must be ignored.
static const char *kSampleLog =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'flash_fwd' for 'sm_90a'\n"
    "ptxas info    : Function properties for flash_fwd\n"
    "ptxas         .     24 bytes stack frame, 20 bytes spill stores, "
    "28 bytes spill loads\n"
    "ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem\n"
    "ptxas info    : Compile time = 123.456 ms\n"
    "ptxas info    : Compiling entry function 'small' for 'sm_90a'\n"
    "ptxas info    : Function properties for small\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, "
    "0 bytes spill loads\n"
    "ptxas info    : Used 12 registers, used 0 barriers\n"
    "ptxas info    : Compile time = 1.670 ms\n"
    "info    : 0 bytes gmem\n"
    "info    : Function properties for 'small':\n"
    "info    : used 12 registers, used 0 barriers, 0 stack, 0 bytes smem, "
    "556 bytes cmem[0], 0 bytes lmem\n"
    "info    : Function properties for 'flash_fwd':\n"
    "info    : used 255 registers, used 1 barriers, 24 stack, 50176 bytes "
    "smem, 580 bytes cmem[0], 0 bytes lmem\n";

TEST(ResourceUsage, ParsesEachFunction) {
  auto usage = parseResourceUsagePerFunction(kSampleLog);
  ASSERT_EQ(usage.size(), 2u);
  const ResourceUsage &fwd = usage.at("flash_fwd");
  EXPECT_EQ(fwd.registers, 255);
  EXPECT_EQ(fwd.stackBytes, 24);
  EXPECT_EQ(fwd.spillStoresBytes, 20);
  EXPECT_EQ(fwd.spillLoadsBytes, 28);
  EXPECT_EQ(fwd.sharedBytes, 50176) << "the linked cubin's value wins";
  EXPECT_EQ(fwd.barriers, 1);
  EXPECT_TRUE(fwd.spills());

  ResourceUsage small = parseResourceUsage(kSampleLog, "small");
  EXPECT_EQ(small.registers, 12);
  EXPECT_EQ(small.sharedBytes, 0);
  EXPECT_EQ(small.stackBytes, 0);
  EXPECT_FALSE(small.spills());
}

TEST(ResourceUsage, AggregateIsTheMaximum) {
  ResourceUsage all = parseResourceUsage(kSampleLog);
  EXPECT_EQ(all.registers, 255);
  EXPECT_EQ(all.spillLoadsBytes, 28);
  EXPECT_EQ(all.sharedBytes, 50176);
}

TEST(ResourceUsage, MissingInformation) {
  EXPECT_EQ(parseResourceUsage("").registers, -1);
  EXPECT_EQ(parseResourceUsage(kSampleLog, "no_such_kernel").registers, -1);
  EXPECT_TRUE(parseResourceUsagePerFunction("garbage\nmore garbage").empty());
}
