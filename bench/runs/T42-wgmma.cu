// How close one warpgroup's chain of 8 dependent m64n128k16 warpgroup MMAs
// (S = Q K^T of a 64-row slice at d = 128: 512 clocks at the tensor cores'
// peak) comes to that peak when waited for at once, against two
// warpgroups doing the same at the same time (T42, hypothesis (b) in
// bench/NOTES.md: softcap's long softmaxes make the two consumer
// warpgroups' chains alternate). (Two chains in flight from one
// warpgroup were left out: ptxas serialised them here, C7514, the
// accumulators copied across the loop's back edge.)
// Operands are shared-memory descriptors over zeroed memory (128-byte
// swizzle, 1024-byte stride, as flashjit's S products): the values do not
// matter, only the time. Prints TFLOP/s and the share of the peak at the
// clock the device reports (4096 FLOP a clock an SM, dense bf16).
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitGroup() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

/// One m64n128k16 product accumulating into d (scaleD 0: d = A B).
__device__ __forceinline__ void mma(float *d, uint64_t a, uint64_t b, int scaleD) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(a), "l"(b), "r"(scaleD));
}

/// The descriptor of the 16-column step k of a 128-byte swizzled tile at
/// shared address base (two 64-column halves of 16 KB each).
__device__ __forceinline__ uint64_t desc(uint32_t base, int k) {
  uint32_t addr = base + (k / 4) * 16384 + (k % 4) * 32;
  return (uint64_t(1) << 62) | (uint64_t(1024 >> 4) << 32) | uint64_t((addr >> 4) & 0x3fff);
}

/// The chain: 8 k-steps of d = Q K^T.
__device__ __forceinline__ void chain(float *d, uint32_t q, uint32_t kk) {
#pragma unroll
  for (int k = 0; k < 8; ++k) mma(d, desc(q, k), desc(kk, k), k > 0);
}

/// Each active warpgroup: chain, commit, wait 0 (the loop's S), reps times.
__global__ void __launch_bounds__(256, 1) k(float *out, int reps, int groups) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int wg = threadIdx.x / 128;
  for (int i = threadIdx.x; i < 65536 / 4; i += blockDim.x) reinterpret_cast<uint32_t *>(smem)[i] = 0;
  __syncthreads();
  if (wg >= groups) return;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t q = base, kk = base + 32768;
  float d0[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d0[i] = 0.f;
  for (int r = 0; r < reps; ++r) {
    fence();
    chain(d0, q, kk);
    commit();
    waitGroup<0>();
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += d0[i];
  if (s == 1.2345f) out[0] = s;
}

void run(const char *name, int groups, int sms) {
  float *out; cudaMalloc(&out, 4);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  const int reps = 20000;
  k<<<sms, 128 * groups, 65536>>>(out, 10, groups);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  float best = 1e9;
  for (int t = 0; t < 3; ++t) {
    cudaEventRecord(a); k<<<sms, 128 * groups, 65536>>>(out, reps, groups); cudaEventRecord(b);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best;
  }
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0); // kHz
  double flop = double(sms) * groups * reps * 8 * 2.0 * 64 * 128 * 16;
  double tflops = flop / (best * 1e-3) / 1e12, peak = double(sms) * 4096 * clk * 1e3 / 1e12;
  printf("%-52s %7.1f TFLOP/s, %5.1f%% of %.0f  %s\n", name, tflops, 100 * tflops / peak, peak,
         cudaGetErrorString(cudaGetLastError()));
  cudaFree(out);
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run("one warpgroup an SM: chain, wait 0", 1, sms);
  run("two warpgroups an SM, each: chain, wait 0", 2, sms);
}
