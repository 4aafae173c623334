// RUN: flashjit-opt %s --split-input-file --verify-diagnostics

// expected-error @+2 {{head_dim_qk must be in [1, 512], got 0}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 0 : i64, head_dim_v = 64 : i64, mask = "none"}
}

// -----

// expected-error @+2 {{head_dim_v must be in [1, 512], got 600}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 600 : i64, mask = "none"}
}

// -----

// expected-error @+2 {{element_type must be bf16 or f16, got 'f32'}}
module {
attn.flash_fwd @a {element_type = f32, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"}
}

// -----

// expected-error @+2 {{mask must be "none", "causal" or "sliding_window", got "diagonal"}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "diagonal"}
}

// -----

// expected-error @+2 {{gqa must be >= 1, got 0}}
module {
attn.flash_fwd @a {element_type = bf16, gqa = 0 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"}
}

// -----

// expected-error @+2 {{sparse_block must be >= 0 (0 = dense), got -128}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = -128 : i64}
}

// -----

module {
// expected-error @+1 {{head_dim_qk must be in [1, 512], got -5}}
attn.flash_fwd @a {element_type = bf16, head_dim_qk = -5 : i64, head_dim_v = 64 : i64, mask = "none"}
}

// -----

// attn.flash_bwd shares the forward's verifier.
// expected-error @+2 {{head_dim_v must be in [1, 512], got 513}}
module {
attn.flash_bwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 513 : i64, mask = "none"}
}

// -----

// expected-error @+2 {{mask must be "none", "causal" or "sliding_window", got "full"}}
module {
attn.flash_bwd @a {element_type = f16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "full"}
}

// -----

// expected-error @+2 {{element_type must be bf16 or f16, got 'f64'}}
module {
attn.flash_bwd @a {element_type = f64, gqa = 0 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"}
}
