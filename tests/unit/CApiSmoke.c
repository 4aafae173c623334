/*===- CApiSmoke.c - flashjit.h used from plain C -------------------------===//
 *
 * Proves that the C API header is C (compiled as C99 here) and that a C
 * caller can run a forward and a backward (with the workspace it asks for)
 * on the CPU and read the error of a bad call.
 * Called by CApiTests.cpp; returns 0 on success, else writes why to \p why.
 *
 *===----------------------------------------------------------------------===*/
#include "flashjit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fp16 bits of a small float that fp16 represents exactly (|x| in [2^-14,
 * 2), at most 10 mantissa bits); enough for this test's inputs. */
static uint16_t fp16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) == 0)
    return sign;
  int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  uint16_t mant = (uint16_t)((u >> 13) & 0x3ffu);
  return (uint16_t)(sign | (uint16_t)(exp << 10) | mant);
}

static float fp16_value(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  float v = exp == 0 ? ldexpf((float)mant, -24)
                     : ldexpf((float)(mant + 1024), exp - 25);
  return (h & 0x8000) ? -v : v;
}

int flashjit_c_smoke(char *why, size_t whyLen) {
  enum { B = 1, H = 2, N = 8, D = 16 };
  static uint16_t q[B * H * N * D], k[B * H * N * D], v[B * H * N * D],
      o[B * H * N * D], d_o[B * H * N * D], dq[B * H * N * D],
      dk[B * H * N * D], dv[B * H * N * D];
  float lse[B * H * N];
  flashjit_handle *h = NULL;
  flashjit_spec spec;
  int i;

  if (flashjit_create(&h, FLASHJIT_DEVICE_CPU) != FLASHJIT_OK) {
    snprintf(why, whyLen, "create: %s", flashjit_last_error(NULL));
    return 1;
  }
  flashjit_spec_init(&spec);
  spec.head_dim_qk = spec.head_dim_v = D;
  spec.dtype = FLASHJIT_DTYPE_FP16;
  spec.mask = FLASHJIT_MASK_CAUSAL;

  /* q = 0: every visible key gets the same score, so O's row i is the mean
   * of V's rows 0..i and lse = log(i + 1). */
  for (i = 0; i < B * H * N * D; ++i) {
    q[i] = 0;
    k[i] = fp16_bits((float)((i * 7) % 5) * 0.25f);
    v[i] = fp16_bits((float)((i / D) % N)); /* V row j holds j */
  }
  {
    flashjit_tensor tq = {q, {B, H, N, D}, {H * N * D, N * D, D, 1}};
    flashjit_tensor tk = {k, {B, H, N, D}, {H * N * D, N * D, D, 1}};
    flashjit_tensor tv = {v, {B, H, N, D}, {H * N * D, N * D, D, 1}};
    flashjit_tensor to = {o, {B, H, N, D}, {H * N * D, N * D, D, 1}};
    flashjit_status s = flashjit_forward(h, &spec, &tq, &tk, &tv, &to, lse, 0.0,
                                         -1, -1, NULL, NULL);
    if (s != FLASHJIT_OK) {
      snprintf(why, whyLen, "forward: %s: %s", flashjit_status_name(s),
               flashjit_last_error(h));
      flashjit_destroy(h);
      return 1;
    }
    for (i = 0; i < B * H * N; ++i) {
      int row = i % N, c;
      float want = (float)row / 2.0f;
      for (c = 0; c < D; ++c) {
        float got = fp16_value(o[i * D + c]);
        if (fabsf(got - want) > 1e-2f) {
          snprintf(why, whyLen, "o[%d][%d] = %g, expected %g", i, c, got, want);
          flashjit_destroy(h);
          return 1;
        }
      }
      if (fabsf(lse[i] - logf((float)(row + 1))) > 1e-3f) {
        snprintf(why, whyLen, "lse[%d] = %g, expected %g", i, lse[i],
                 logf((float)(row + 1)));
        flashjit_destroy(h);
        return 1;
      }
    }

    /* The backward for dO = 1: P's row i is 1 / (i + 1) on keys 0..i, so
     * dV's row j is sum over i >= j of 1 / (i + 1). */
    {
      flashjit_tensor tdo = {d_o, {B, H, N, D}, {H * N * D, N * D, D, 1}};
      flashjit_tensor tdq = {dq, {B, H, N, D}, {H * N * D, N * D, D, 1}};
      flashjit_tensor tdk = {dk, {B, H, N, D}, {H * N * D, N * D, D, 1}};
      flashjit_tensor tdv = {dv, {B, H, N, D}, {H * N * D, N * D, D, 1}};
      size_t bytes = 0;
      void *workspace;
      for (i = 0; i < B * H * N * D; ++i)
        d_o[i] = fp16_bits(1.0f);
      s = flashjit_backward_workspace_size(h, &spec, B, H, N, N, &bytes);
      if (s != FLASHJIT_OK || bytes < B * H * N * sizeof(float)) {
        snprintf(why, whyLen, "workspace size: %s: %s (%zu bytes)",
                 flashjit_status_name(s), flashjit_last_error(h), bytes);
        flashjit_destroy(h);
        return 1;
      }
      workspace = malloc(bytes);
      s = flashjit_backward(h, &spec, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk,
                            &tdv, 0.0, -1, -1, NULL, workspace, bytes, NULL);
      free(workspace);
      if (s != FLASHJIT_OK) {
        snprintf(why, whyLen, "backward: %s: %s", flashjit_status_name(s),
                 flashjit_last_error(h));
        flashjit_destroy(h);
        return 1;
      }
      for (i = 0; i < B * H * N; ++i) {
        int row = i % N, c, r;
        float want = 0.0f;
        for (r = row; r < N; ++r)
          want += 1.0f / (float)(r + 1);
        for (c = 0; c < D; ++c) {
          float got = fp16_value(dv[i * D + c]);
          if (fabsf(got - want) > 1e-2f) {
            snprintf(why, whyLen, "dv[%d][%d] = %g, expected %g", i, c, got,
                     want);
            flashjit_destroy(h);
            return 1;
          }
        }
      }
    }

    /* An error: a bad head dim, named in the message. */
    spec.head_dim_qk = 0;
    s = flashjit_forward(h, &spec, &tq, &tk, &tv, &to, lse, 0.0, -1, -1, NULL,
                         NULL);
    if (s != FLASHJIT_ERROR_INVALID_ARGUMENT ||
        !strstr(flashjit_last_error(h), "head_dim_qk")) {
      snprintf(why, whyLen, "bad head dim: %s: %s", flashjit_status_name(s),
               flashjit_last_error(h));
      flashjit_destroy(h);
      return 1;
    }
  }
  flashjit_destroy(h);
  return 0;
}
