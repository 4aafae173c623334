//===- RuntimeGpuTests.cpp - Runtime tests on a real GPU ------------------===//
//-------------------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Loads hand-written PTX kernels (compiled by nvJitLink, or JIT-compiled by
/// the driver), launches them and checks every output element. Outputs are
/// poisoned before each launch so that an element the kernel never wrote
/// fails the test. Without a CUDA driver every test is skipped (ctest label
/// "gpu" and SKIP_REGULAR_EXPRESSION make ctest report them as skipped).
///
//===----------------------------------------------------------------------===//

#include "runtime/AttentionLauncher.h"
#include "runtime/CudaDriver.h"
#include "runtime/NvJitLink.h"
#include "tests/unit/runtime/TestKernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>

using namespace flashjit::rt;

namespace {

/// A NaN with a payload no kernel computes: the poison for float outputs.
constexpr std::uint32_t kPoison = 0x7fc0dead;

bool isPoison(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits == kPoison;
}

/// Fresh random inputs on every run, never zeros.
std::vector<float> randomFloats(std::size_t n, std::mt19937 &rng) {
  std::uniform_real_distribution<float> dist(0.5f, 2.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(n);
  for (float &x : v)
    x = negative(rng) ? -dist(rng) : dist(rng);
  return v;
}

class RuntimeGpu : public ::testing::Test {
protected:
  void SetUp() override {
    if (!CudaDriver::get().available())
      GTEST_SKIP() << "skipped: no CUDA driver ("
                   << CudaDriver::get().unavailableReason() << ")";
    info = queryDevice(0);
    std::random_device seed;
    unsigned s = seed();
    rng.seed(s);
    RecordProperty("seed", std::to_string(s));
  }

  /// The test kernels as a module, compiled for this GPU by nvJitLink.
  Module loadTestKernels() {
    CubinResult result = ptxToCubin(test::kTestKernelsPtx, info.targetArch());
    return Module(result.cubin);
  }

  /// Runs vector_add on n elements with \p module and checks every element.
  void checkVectorAdd(const Module &module, unsigned n) {
    CUfunction function = module.function("vector_add");
    std::vector<float> a = randomFloats(n, rng), b = randomFloats(n, rng);
    // 64 guard elements past n: the kernel must not write them.
    const unsigned guard = 64;
    DeviceBuffer da(n * sizeof(float)), db(n * sizeof(float)),
        dc((n + guard) * sizeof(float));
    da.uploadVector(a);
    db.uploadVector(b);
    dc.memset32(kPoison);

    CUdeviceptr pa = da.ptr(), pb = db.ptr(), pc = dc.ptr();
    void *params[] = {&pa, &pb, &pc, &n};
    unsigned block = 256;
    launch(function, {(n + block - 1) / block, 1, 1}, {block, 1, 1}, 0, nullptr,
           params);
    CudaDriver::get().synchronize();

    std::vector<float> c = dc.downloadVector<float>();
    ASSERT_EQ(c.size(), n + guard);
    std::size_t bad = 0;
    for (unsigned i = 0; i < n; ++i) {
      if (c[i] != a[i] + b[i] && bad++ < 5)
        ADD_FAILURE() << "c[" << i << "] = " << c[i] << ", expected "
                      << a[i] + b[i]
                      << (isPoison(c[i]) ? " (never written)" : "");
    }
    EXPECT_EQ(bad, 0u) << "wrong elements out of " << n;
    for (unsigned i = n; i < n + guard; ++i)
      EXPECT_TRUE(isPoison(c[i])) << "guard element " << i << " overwritten";
  }

  DeviceInfo info;
  std::mt19937 rng;
};

} // namespace

TEST_F(RuntimeGpu, QueryDevice) {
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.ccMajor, 7);
  EXPECT_GT(info.smCount, 0);
  EXPECT_EQ(info.maxSharedPerBlock, 48 * 1024);
  EXPECT_GE(info.maxSharedPerBlockOptin, info.maxSharedPerBlock);
  EXPECT_GT(info.regsPerBlock, 0);
  EXPECT_EQ(info.warpSize, 32);
  EXPECT_GT(info.totalMemBytes, 0u);
  EXPECT_GE(info.driverVersion, 12000);
  EXPECT_EQ(info.targetArch().rfind("sm_", 0), 0u);
  RecordProperty("device", info.name);
  RecordProperty("arch", info.targetArch());
}

TEST_F(RuntimeGpu, ContextPolicy) {
  CudaDriver &driver = CudaDriver::get();
  CUcontext context = driver.ensureContext();
  ASSERT_NE(context, nullptr);
  // Once a context is current it is the one used.
  EXPECT_EQ(driver.ensureContext(), context);
  EXPECT_EQ(driver.currentDevice(), 0);
  EXPECT_FALSE(isStreamCapturing(nullptr));
}

TEST_F(RuntimeGpu, DeviceBufferRoundTrip) {
  std::vector<std::uint8_t> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<std::uint8_t>(rng());
  DeviceBuffer buffer(host.size());
  buffer.memset8(0xab);
  EXPECT_EQ(buffer.download(), std::vector<std::uint8_t>(1000, 0xab));
  buffer.upload(host);
  EXPECT_EQ(buffer.download(), host);
  std::uint8_t middle[10];
  buffer.download(middle, sizeof(middle), 500);
  EXPECT_EQ(std::memcmp(middle, host.data() + 500, sizeof(middle)), 0);
  EXPECT_THROW(buffer.upload(host.data(), 10, 995), RuntimeError);
  DeviceBuffer odd(1001);
  EXPECT_THROW(odd.memset32(0), RuntimeError);
  DeviceBuffer empty(0);
  EXPECT_EQ(empty.ptr(), 0u);
  EXPECT_TRUE(empty.download().empty());
}

TEST_F(RuntimeGpu, VectorAddFromNvJitLinkCubin) {
  Module module = loadTestKernels();
  for (unsigned n : {1u, 17u, 1000u, 4097u, 1u << 20})
    checkVectorAdd(module, n);
}

TEST_F(RuntimeGpu, VectorAddFromPtxThroughDriverJit) {
  Module module{std::string(test::kTestKernelsPtx)};
  checkVectorAdd(module, 12345);
}

TEST_F(RuntimeGpu, LargeDynamicSharedMemory) {
  const unsigned sharedBytes = 100 * 1024;
  if (static_cast<unsigned>(info.maxSharedPerBlockOptin) < sharedBytes)
    GTEST_SKIP() << "skipped: device allows only "
                 << info.maxSharedPerBlockOptin << " bytes of shared memory";
  Module module = loadTestKernels();
  CUfunction function = module.function("smem_roundtrip");
  unsigned words = sharedBytes / 4;
  const unsigned blocks = 3;
  std::vector<float> in = randomFloats(blocks * words, rng);
  DeviceBuffer din(in.size() * sizeof(float)), dout(in.size() * sizeof(float));
  din.uploadVector(in);
  dout.memset32(kPoison);
  CUdeviceptr pin = din.ptr(), pout = dout.ptr();
  void *params[] = {&pin, &pout, &words};
  launch(function, {blocks, 1, 1}, {256, 1, 1}, sharedBytes, nullptr, params);
  CudaDriver::get().synchronize();

  std::vector<float> out = dout.downloadVector<float>();
  std::size_t bad = 0;
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < words; ++w) {
      float expected = in[b * words + (words - 1 - w)];
      float got = out[b * words + w];
      if (got != expected && bad++ < 5)
        ADD_FAILURE() << "block " << b << " word " << w << ": " << got
                      << " != " << expected;
    }
  EXPECT_EQ(bad, 0u);
}

/// launchRecorded (what both attention launchers call) takes the grid,
/// block and shared memory from a kernel's record: smem_roundtrip reverses
/// each block's 100 KiB in shared memory, over a grid of ceil(Nkv / rows)
/// blocks along x; the same record asking more shared memory than the
/// device has is the driver's named error.
TEST_F(RuntimeGpu, RecordedLaunchGivesGridBlockAndSharedMemory) {
  const int64_t sharedBytes = 100 * 1024;
  if (info.maxSharedPerBlockOptin < sharedBytes)
    GTEST_SKIP() << "skipped: device allows only "
                 << info.maxSharedPerBlockOptin << " bytes of shared memory";
  Module module = loadTestKernels();
  CUfunction function = module.function("smem_roundtrip");
  flashjit::KernelLaunch record{"smem_roundtrip", 256, sharedBytes, 64, true, true, 1};
  flashjit::Problem p;
  p.batch = 1;
  p.heads = 2; // one KV head of gqa 2: grid.y = 1
  p.seqLenKV = 3 * 64 - 5;
  ASSERT_EQ(record.grid(p, 2), (std::array<int64_t, 3>{3, 1, 1}));
  unsigned words = unsigned(sharedBytes / 4);
  const unsigned blocks = 3;
  std::vector<float> in = randomFloats(blocks * words + words, rng);
  DeviceBuffer din(in.size() * sizeof(float)), dout(in.size() * sizeof(float));
  din.uploadVector(in);
  dout.memset32(kPoison);
  CUdeviceptr pin = din.ptr(), pout = dout.ptr();
  void *params[] = {&pin, &pout, &words};
  launchRecorded(function, record, p, 2, nullptr, params);
  CudaDriver::get().synchronize();
  std::vector<float> out = dout.downloadVector<float>();
  std::size_t bad = 0;
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < words; ++w)
      if (out[b * words + w] != in[b * words + (words - 1 - w)] && bad++ < 5)
        ADD_FAILURE() << "block " << b << " word " << w;
  EXPECT_EQ(bad, 0u);
  for (unsigned w = 0; w < words; ++w)
    ASSERT_TRUE(isPoison(out[blocks * words + w]))
        << "a fourth block ran: word " << w;

  record.sharedBytes = info.maxSharedPerBlockOptin + 1024;
  EXPECT_THROW(launchRecorded(function, record, p, 2, nullptr, params),
               RuntimeError);
}

TEST_F(RuntimeGpu, TooMuchSharedMemoryIsExplained) {
  Module module = loadTestKernels();
  CUfunction function = module.function("smem_roundtrip");
  unsigned sharedBytes = info.maxSharedPerBlockOptin + 1024;
  CUdeviceptr null = 0;
  unsigned words = 0;
  void *params[] = {&null, &null, &words};
  try {
    launch(function, {1, 1, 1}, {32, 1, 1}, sharedBytes, nullptr, params);
    FAIL() << "launch with " << sharedBytes << " bytes of shared memory";
  } catch (const RuntimeError &e) {
    EXPECT_EQ(e.code(), ErrorCode::DriverError);
    EXPECT_NE(std::string(e.what()).find("MAX_DYNAMIC_SHARED_SIZE_BYTES"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(RuntimeGpu, DriverErrorsNameTheCall) {
  Module module = loadTestKernels();
  try {
    module.function("no_such_kernel");
    FAIL() << "found a kernel that does not exist";
  } catch (const RuntimeError &e) {
    EXPECT_EQ(e.code(), ErrorCode::DriverError);
    EXPECT_NE(std::string(e.what()).find(
                  "cuModuleGetFunction(no_such_kernel) failed: "
                  "CUDA_ERROR_NOT_FOUND"),
              std::string::npos)
        << e.what();
  }
  std::vector<char> garbage = {0x7f, 'E', 'L', 'F', 0, 1, 2, 3, 4, 5, 6, 7};
  try {
    Module bad(garbage);
    FAIL() << "loaded a garbage image";
  } catch (const RuntimeError &e) {
    EXPECT_NE(
        std::string(e.what()).find("cuModuleLoadDataEx failed: CUDA_ERROR_"),
        std::string::npos)
        << e.what();
  }
  try {
    Module bad{std::string(test::kBrokenPtx)};
    FAIL() << "JIT-compiled broken PTX";
  } catch (const RuntimeError &e) {
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_INVALID_PTX"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(RuntimeGpu, EventTimer) {
  Module module = loadTestKernels();
  CUfunction function = module.function("vector_add");
  unsigned n = 1u << 24;
  DeviceBuffer a(n * 4), b(n * 4), c(n * 4);
  a.memset32(0x3f800000);
  b.memset32(0x40000000);
  CUdeviceptr pa = a.ptr(), pb = b.ptr(), pc = c.ptr();
  void *params[] = {&pa, &pb, &pc, &n};
  EventTimer timer;
  timer.start();
  for (int i = 0; i < 10; ++i)
    launch(function, {n / 256, 1, 1}, {256, 1, 1}, 0, nullptr, params);
  timer.stop();
  float ms = timer.elapsedMs();
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);
  // 10 x 3 x 64 MiB: report the bandwidth for the log.
  double gbPerS = 10.0 * 3 * n * 4 / (ms * 1e-3) / 1e9;
  RecordProperty("vector_add_GBps", std::to_string(gbPerS));
  std::vector<float> out = c.downloadVector<float>();
  std::size_t bad = 0;
  for (unsigned i = 0; i < n; ++i)
    bad += out[i] != 3.0f;
  EXPECT_EQ(bad, 0u);
}
