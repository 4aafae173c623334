// Throughput of the softmax's per-score instruction chains (per SM per clock).
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ float tanh32(float x){float y;asm("tanh.approx.f32 %0,%1;":"=f"(y):"f"(x));return y;}
__device__ __forceinline__ float ex232(float x){float y;asm("ex2.approx.ftz.f32 %0,%1;":"=f"(y):"f"(x));return y;}
__device__ __forceinline__ unsigned tanh16(unsigned x){unsigned y;asm("tanh.approx.f16x2 %0,%1;":"=r"(y):"r"(x));return y;}
__device__ __forceinline__ unsigned ex216(unsigned x){unsigned y;asm("ex2.approx.f16x2 %0,%1;":"=r"(y):"r"(x));return y;}
__device__ __forceinline__ unsigned pk16(float lo,float hi){unsigned y;asm("cvt.rn.f16x2.f32 %0,%1,%2;":"=r"(y):"f"(hi),"f"(lo));return y;}
__device__ __forceinline__ unsigned pkbf(float lo,float hi){unsigned y;asm("cvt.rn.bf16x2.f32 %0,%1,%2;":"=r"(y):"f"(hi),"f"(lo));return y;}
__device__ __forceinline__ void up16(unsigned v,float&lo,float&hi){unsigned short a,b;asm("mov.b32 {%0,%1},%2;":"=h"(a),"=h"(b):"r"(v));asm("cvt.f32.f16 %0,%1;":"=f"(lo):"h"(a));asm("cvt.f32.f16 %0,%1;":"=f"(hi):"h"(b));}
__device__ __forceinline__ unsigned hfma2(unsigned a,unsigned b,unsigned c){unsigned y;asm("fma.rn.f16x2 %0,%1,%2,%3;":"=r"(y):"r"(a),"r"(b),"r"(c));return y;}
constexpr int P = 8; // independent pairs per thread
template <int K> __global__ void k(unsigned *out, int iters, float c, float F, float m) {
  float s[2*P]; float sum = 0.f; unsigned acc = 0;
  for (int i = 0; i < 2*P; ++i) s[i] = 0.001f * (threadIdx.x + i);
  unsigned F2 = pk16(F, F), mF2 = pk16(-F, -F);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < P; ++i) {
      float a = s[2*i], b = s[2*i+1], p0, p1;
      if (K == 0) { // plain: fma, ex2
        p0 = ex232(fmaf(a, F, -m)); p1 = ex232(fmaf(b, F, -m));
      } else if (K == 1) { // softcap f32
        p0 = ex232(fmaf(tanh32(a*c), F, -m)); p1 = ex232(fmaf(tanh32(b*c), F, -m));
      } else if (K == 2) { // tanh f16x2, exponent f32, ex2 f32
        float t0, t1; up16(tanh16(pk16(a*c, b*c)), t0, t1);
        p0 = ex232(fmaf(t0, F, -m)); p1 = ex232(fmaf(t1, F, -m));
      } else if (K == 3) { // tanh f16x2, exponent f32, ex2 f16x2
        float t0, t1; up16(tanh16(pk16(a*c, b*c)), t0, t1);
        up16(ex216(pk16(fmaf(t0, F, -m), fmaf(t1, F, -m))), p0, p1);
      } else if (K == 4) { // all f16x2 (HFMA2 exponent)
        up16(ex216(hfma2(tanh16(pk16(a*c, b*c)), F2, mF2)), p0, p1);
      } else { // plain with ex2 f16x2
        up16(ex216(pk16(fmaf(a, F, -m), fmaf(b, F, -m))), p0, p1);
      }
      sum += p0 + p1; acc ^= pkbf(p0, p1);
      s[2*i] = p1 + a; s[2*i+1] = p0 - b;
    }
  }
  if (acc == 0x12345678u && sum == 1.f) out[0] = acc;
}
template <int K> void run(const char *name, int sms) {
  unsigned *out; cudaMalloc(&out, 4);
  int iters = 4000, blocks = sms * 2, threads = 512;
  k<K><<<blocks, threads>>>(out, 10, 0.03f, 43.f, 43.f);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  float best = 1e9;
  for (int r = 0; r < 3; ++r) {
    cudaEventRecord(a); k<K><<<blocks, threads>>>(out, iters, 0.03f, 43.f, 43.f); cudaEventRecord(b);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best;
  }
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  double scores = double(blocks) * threads * iters * 2 * P;
  printf("%-34s scores/clk/SM %6.2f  %s\n", name, scores / (best * 1e-3 * clk * 1e3) / sms, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run<0>("plain f32", sms); run<5>("plain ex2 f16x2", sms);
  run<1>("softcap f32", sms); run<2>("softcap tanh f16x2", sms);
  run<3>("softcap tanh+ex2 f16x2, fma f32", sms); run<4>("softcap all f16x2 (hfma2)", sms);
}
