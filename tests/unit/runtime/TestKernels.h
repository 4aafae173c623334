//===- TestKernels.h - Hand-written PTX for the runtime tests ---*- C++ -*-===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Small PTX kernels written by hand, so that the runtime can be tested
/// without the MLIR pipeline: the unit tests turn them into cubins with
/// nvJitLink (no GPU needed), the GPU tests launch them.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_TESTS_UNIT_RUNTIME_TESTKERNELS_H
#define FLASHJIT_TESTS_UNIT_RUNTIME_TESTKERNELS_H

namespace flashjit::rt::test {

/// vector_add(const float *a, const float *b, float *c, u32 n):
/// c[i] = a[i] + b[i] for i < n, one thread per element.
///
/// smem_roundtrip(const float *in, float *out, u32 words): block b copies its
/// `words` floats in[b*words ...] into dynamic shared memory, and writes them
/// back reversed: out[b*words + w] = in[b*words + words-1-w]. Launched with
/// words*4 bytes of dynamic shared memory (beyond 48 KiB, it needs the
/// opt-in attribute that launch() sets).
inline constexpr const char *kTestKernelsPtx = R"ptx(
.version 8.0
.target sm_80
.address_size 64

.visible .entry vector_add(
    .param .u64 vector_add_param_a,
    .param .u64 vector_add_param_b,
    .param .u64 vector_add_param_c,
    .param .u32 vector_add_param_n)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .f32   %f<4>;
    .reg .b64   %rd<11>;

    ld.param.u64    %rd1, [vector_add_param_a];
    ld.param.u64    %rd2, [vector_add_param_b];
    ld.param.u64    %rd3, [vector_add_param_c];
    ld.param.u32    %r1, [vector_add_param_n];
    mov.u32         %r2, %ctaid.x;
    mov.u32         %r3, %ntid.x;
    mov.u32         %r4, %tid.x;
    mad.lo.s32      %r5, %r2, %r3, %r4;
    setp.ge.u32     %p1, %r5, %r1;
    @%p1 bra        $L_done;
    cvta.to.global.u64  %rd4, %rd1;
    cvta.to.global.u64  %rd5, %rd2;
    cvta.to.global.u64  %rd6, %rd3;
    mul.wide.u32    %rd7, %r5, 4;
    add.s64         %rd8, %rd4, %rd7;
    add.s64         %rd9, %rd5, %rd7;
    add.s64         %rd10, %rd6, %rd7;
    ld.global.f32   %f1, [%rd8];
    ld.global.f32   %f2, [%rd9];
    add.f32         %f3, %f1, %f2;
    st.global.f32   [%rd10], %f3;
$L_done:
    ret;
}

.extern .shared .align 16 .b8 smem_roundtrip_dyn[];

.visible .entry smem_roundtrip(
    .param .u64 smem_roundtrip_param_in,
    .param .u64 smem_roundtrip_param_out,
    .param .u32 smem_roundtrip_param_words)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<12>;
    .reg .f32   %f<2>;
    .reg .b64   %rd<12>;

    ld.param.u64    %rd1, [smem_roundtrip_param_in];
    ld.param.u64    %rd2, [smem_roundtrip_param_out];
    ld.param.u32    %r1, [smem_roundtrip_param_words];
    cvta.to.global.u64  %rd1, %rd1;
    cvta.to.global.u64  %rd2, %rd2;
    mov.u32         %r2, %ctaid.x;
    mov.u32         %r3, %ntid.x;
    mov.u32         %r4, %tid.x;
    // Block base: b * words floats.
    mul.wide.u32    %rd3, %r2, %r1;
    shl.b64         %rd3, %rd3, 2;
    add.s64         %rd4, %rd1, %rd3;
    add.s64         %rd5, %rd2, %rd3;
    mov.u32         %r5, smem_roundtrip_dyn;

    // for (w = tid; w < words; w += ntid) smem[w] = in[base + w]
    mov.u32         %r6, %r4;
$L_load:
    setp.ge.u32     %p1, %r6, %r1;
    @%p1 bra        $L_load_done;
    mul.wide.u32    %rd6, %r6, 4;
    add.s64         %rd7, %rd4, %rd6;
    ld.global.f32   %f1, [%rd7];
    shl.b32         %r7, %r6, 2;
    add.s32         %r8, %r5, %r7;
    st.shared.f32   [%r8], %f1;
    add.s32         %r6, %r6, %r3;
    bra.uni         $L_load;
$L_load_done:
    bar.sync        0;

    // for (w = tid; w < words; w += ntid) out[base + w] = smem[words-1-w]
    mov.u32         %r6, %r4;
$L_store:
    setp.ge.u32     %p2, %r6, %r1;
    @%p2 bra        $L_store_done;
    sub.s32         %r9, %r1, %r6;
    sub.s32         %r9, %r9, 1;
    shl.b32         %r10, %r9, 2;
    add.s32         %r11, %r5, %r10;
    ld.shared.f32   %f1, [%r11];
    mul.wide.u32    %rd8, %r6, 4;
    add.s64         %rd9, %rd5, %rd8;
    st.global.f32   [%rd9], %f1;
    add.s32         %r6, %r6, %r3;
    bra.uni         $L_store;
$L_store_done:
    ret;
}
)ptx";

/// PTX with a syntax error on purpose ("add.f32" with a missing operand).
inline constexpr const char *kBrokenPtx = R"ptx(
.version 8.0
.target sm_80
.address_size 64

.visible .entry broken(.param .u64 broken_param_a)
{
    .reg .f32   %f<3>;
    mov.f32     %f1, 0f3F800000;
    add.f32     %f2, %f1;
    ret;
}
)ptx";

} // namespace flashjit::rt::test

#endif // FLASHJIT_TESTS_UNIT_RUNTIME_TESTKERNELS_H
