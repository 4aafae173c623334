"""float64 reference attention in numpy (shared by the CPU and GPU tests)."""

import numpy as np


def random_qkv(rng, B, H, Hkv, Nq, Nkv, D=32, Dv=32):
    """Fresh float16 q (B, H, Nq, D), k (B, Hkv, Nkv, D), v (B, Hkv, Nkv,
    Dv), standard normal."""
    q = rng.standard_normal((B, H, Nq, D)).astype(np.float16)
    k = rng.standard_normal((B, Hkv, Nkv, D)).astype(np.float16)
    v = rng.standard_normal((B, Hkv, Nkv, Dv)).astype(np.float16)
    return q, k, v


def visible_mask(nq, nkv, causal=False, window=None, dense_blocks=None,
                 block=None):
    """[B|1, H|1, Nq, Nkv] boolean: which keys each query sees."""
    i = np.arange(nq)[:, None]
    j = np.arange(nkv)[None, :]
    diag = i + (nkv - nq)
    vis = np.ones((nq, nkv), dtype=bool)
    if causal:
        vis &= j <= diag
    if window is not None:
        left, right = window
        if left is not None:
            vis &= j >= diag - left
        if right is not None:
            vis &= j <= diag + right
    vis = vis[None, None]
    if dense_blocks is not None:
        d = np.asarray(dense_blocks, dtype=bool)
        while d.ndim < 4:
            d = d[None]
        vis = vis & d[:, :, i // block, j // block]
    return vis


def positions(shape):
    """(b, h, i, j): the batch, head, query and key indices of a
    [B, H, Nq, Nkv] array, as int arrays that broadcast to it."""
    B, H, Nq, Nkv = shape
    return (np.arange(B)[:, None, None, None],
            np.arange(H)[None, :, None, None],
            np.arange(Nq)[None, None, :, None],
            np.arange(Nkv)[None, None, None, :])


def modify_by_function(s, fn):
    """(s', d s' / d s) of score modifier fn(s, b, h, i, j) (a Python
    function, as flashjit.attention takes) evaluated on float64 arrays:
    s [B, H, Nq, Nkv] and the integer positions broadcast to it. The
    derivative by central differences (independent of the compiler's);
    0 where s' is not finite (a masked score, whose p is 0)."""
    b, h, i, j = positions(s.shape)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        out = np.broadcast_to(np.asarray(fn(s, b, h, i, j), np.float64),
                              s.shape)
        e = 1e-5 * np.maximum(1.0, np.abs(s))
        d = (np.asarray(fn(s + e, b, h, i, j), np.float64) -
             np.asarray(fn(s - e, b, h, i, j), np.float64)) / (2 * e)
        d = np.where(np.isfinite(out) & np.isfinite(d), d, 0.0)
    return out, np.broadcast_to(d, s.shape)


def modify(s, score_mod):
    """(s', d s' / d s) of the score modifier (None: none) on the scaled
    scores s [B, H, Nq, Nkv], in float64: a function (modify_by_function)
    or a name, softcap:C is C tanh(s / C), alibi:H is s + 2^(-8 (h + 1) /
    H) (j - i)."""
    if not score_mod:
        return s, 1.0
    if callable(score_mod):
        return modify_by_function(s, score_mod)
    name, arg = score_mod.split(":")
    if name == "softcap":
        c = float(np.float32(arg))  # the kernel's f32 constant
        t = np.tanh(s / c)
        return c * t, 1.0 - t * t
    assert name == "alibi", score_mod
    h = np.arange(s.shape[1])[None, :, None, None]
    i = np.arange(s.shape[2])[:, None]
    j = np.arange(s.shape[3])[None, :]
    return s + np.exp2(-8.0 * (h + 1) / int(arg)) * (j - i), 1.0


def _softmax(q, k, v, scale, visible, score_mod=None):
    """float64 inputs (K, V repeated over each GQA group), the unnormalised
    probabilities exp(s - m), the row sums, the rows that see no key and
    the modifier's derivative."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s, dmod = modify(np.einsum("bhid,bhjd->bhij", q, k) * scale, score_mod)
    if visible is not None:
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(m)
    m = np.where(empty, 0.0, m)
    p = np.exp(s - m)
    return q, k, v, scale, m, p, p.sum(axis=-1, keepdims=True), empty, dmod


def attention_ref(q, k, v, scale=None, visible=None, score_mod=None):
    """(o, lse) in float64; rows that see no key: o = 0, lse = -inf."""
    _, _, v, _, m, p, l, empty, _ = _softmax(q, k, v, scale, visible,
                                             score_mod)
    o = np.einsum("bhij,bhjd->bhid", p, v) / np.where(empty, 1.0, l)
    o = np.where(empty, 0.0, o)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(l))[..., 0]
    return o, lse


def rel_err(x, ref):
    x = np.asarray(x, dtype=np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (den if den > 0 else 1.0)


def lse_err(x, ref):
    """Relative error over finite entries; inf if the -inf patterns differ."""
    x = np.asarray(x, dtype=np.float64)
    if np.isnan(x).any() or not np.array_equal(np.isneginf(x), np.isneginf(ref)):
        return np.inf
    f = np.isfinite(ref)
    return rel_err(x[f], ref[f]) if f.any() else 0.0


def attention_grads_ref(q, k, v, o, d_o, scale=None, visible=None,
                        score_mod=None):
    """(dq, dk, dv) in float64 of the attention above for upstream d_o.
    D = rowsum(d_o * o) from the o given (the forward's, as a user has it);
    dk and dv are summed over each GQA group."""
    q, kr, vr, scale, _, p, l, empty, dmod = _softmax(q, k, v, scale,
                                                      visible, score_mod)
    o, d_o = (np.asarray(x, dtype=np.float64) for x in (o, d_o))
    p = np.where(empty, 0.0, p / np.where(empty, 1.0, l))
    dv = np.einsum("bhij,bhid->bhjd", p, d_o)
    dp = np.einsum("bhid,bhjd->bhij", d_o, vr)
    delta = (d_o * o).sum(-1, keepdims=True)
    ds = p * (dp - delta) * dmod
    dq = np.einsum("bhij,bhjd->bhid", ds, kr) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q) * scale
    B, Hkv = np.shape(k)[0], np.shape(k)[1]
    g = q.shape[1] // Hkv
    dk = dk.reshape(B, Hkv, g, *dk.shape[2:]).sum(2)
    dv = dv.reshape(B, Hkv, g, *dv.shape[2:]).sum(2)
    return dq, dk, dv


def _masked_scores(q, k, v, scale, visible):
    """float64 q, k and v repeated over each GQA group, and the scaled,
    masked scores (-inf where not visible)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if visible is not None:
        s = np.where(visible, s, -np.inf)
    return q, k, v, s


def sink_attention_ref(q, k, v, scale, visible, sinks):
    """(o, lse) in float64 of attention with a sink logit per query head:
    the scores of each row get one more entry, sinks[h], whose value row
    is 0 (an extended softmax, computed directly)."""
    _, _, v, s = _masked_scores(q, k, v, scale, visible)
    t = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None],
                        s.shape[:3] + (1,))
    full = np.concatenate([s, t], axis=-1)
    m = full.max(axis=-1, keepdims=True)
    p = np.exp(full - m)
    l = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bhjd->bhid", p[..., :-1], v) / l
    return o, (m + np.log(l))[..., 0]


def sink_attention_grads_ref(q, k, v, d_o, scale, visible, sinks):
    """(dq, dk, dv, dsinks) in float64 of sink_attention_ref for upstream
    d_o: the softmax derivative of the extended rows for q, k, v; dsinks
    by central differences of sum(d_o * o) (independent of any formula)."""
    o, lse = sink_attention_ref(q, k, v, scale, visible, sinks)
    qf, kr, vr, s = _masked_scores(q, k, v, scale, visible)
    d_o = np.asarray(d_o, dtype=np.float64)
    p = np.exp(s - lse[..., None])
    dv = np.einsum("bhij,bhid->bhjd", p, d_o)
    dp = np.einsum("bhid,bhjd->bhij", d_o, vr)
    ds = p * (dp - (d_o * o).sum(-1, keepdims=True))
    dq = np.einsum("bhij,bhjd->bhid", ds, kr) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, qf) * scale
    B, Hkv, g = np.shape(k)[0], np.shape(k)[1], qf.shape[1] // np.shape(k)[1]
    dk = dk.reshape(B, Hkv, g, *dk.shape[2:]).sum(2)
    dv = dv.reshape(B, Hkv, g, *dv.shape[2:]).sum(2)
    t = np.asarray(sinks, np.float64)
    dt = np.empty_like(t)
    for h in range(t.size):
        e = np.zeros_like(t)
        e[h] = 1e-6
        up, _ = sink_attention_ref(q, k, v, scale, visible, t + e)
        down, _ = sink_attention_ref(q, k, v, scale, visible, t - e)
        dt[h] = ((up - down) * d_o).sum() / 2e-6
    return dq, dk, dv, dt


def score_grads_ref(q, k, v, d_o, scale=None, visible=None, score_mod=None,
                    o=None, sinks=None):
    """G = d loss / d s' in float64, [B, H, Nq, Nkv], for loss = sum(d_o *
    o) of the float64 attention above (s' the modified, masked scores):
    G = P * (dP - D), D = rowsum(d_o * o) of the exact float64 o, or of
    the o given (the forward's, rounded to its dtype, as the kernel's
    backward and attention_grads_ref take it). With sinks (one logit per
    query head), P and o are the sink attention's (sink_attention_ref).
    The gradient of anything the modifier reads is the sum of G * d s' /
    d x (a bias[h, i, j] added to s: G summed over the batch)."""
    _, _, vr, _, m, p, l, empty, _ = _softmax(q, k, v, scale, visible,
                                              score_mod)
    if sinks is None:
        p = np.where(empty, 0.0, p / np.where(empty, 1.0, l))
    else:  # p = exp(s' - m); lse' = log(sum exp(s') + exp(t_h))
        t = np.asarray(sinks, np.float64)[None, :, None, None]
        with np.errstate(divide="ignore"):
            lse = np.where(empty, -np.inf, m + np.log(l))
        p = p * np.exp(m - np.logaddexp(lse, t))
    d_o = np.asarray(d_o, dtype=np.float64)
    if o is None:
        o = np.einsum("bhij,bhjd->bhid", p, vr)
    o = np.asarray(o, dtype=np.float64)
    dp = np.einsum("bhid,bhjd->bhij", d_o, vr)
    return p * (dp - (d_o * o).sum(-1, keepdims=True))


def capture_grads_ref(q, k, v, d_o, scale, visible, make_fn, x, o=None,
                      elements=None, sinks=None):
    """d loss / d x in float64 of a tensor x that the modifier make_fn(x)
    reads (loss = sum(d_o * o)), at x's flat elements given (all by
    default, shaped as x): the sum of G * d s' / d x_e (score_grads_ref's
    G, D from the o given or the exact one; sinks as there), d s' / d x_e
    by central differences of the modifier make_fn(x') itself on the
    float64 scores (independent of the compiler's derivative)."""
    x = np.asarray(x, dtype=np.float64)
    g = score_grads_ref(q, k, v, d_o, scale, visible, make_fn(x), o, sinks)
    sc = 1.0 / np.sqrt(np.shape(q)[-1]) if scale is None else scale
    _, _, _, s = _masked_scores(q, k, v, sc, None)
    b, h, i, j = positions(s.shape)
    flat = x.ravel()
    out = []
    for e in (range(x.size) if elements is None else elements):
        step = 1e-5 * max(1.0, abs(flat[e]))
        up, down = flat.copy(), flat.copy()
        up[e] += step
        down[e] -= step
        with np.errstate(invalid="ignore"):
            d = (np.asarray(make_fn(up.reshape(x.shape))(s, b, h, i, j),
                            np.float64) -
                 np.asarray(make_fn(down.reshape(x.shape))(s, b, h, i, j),
                            np.float64)) / (2 * step)
        d = np.where(np.isfinite(d), d, 0.0)  # masked: -inf - -inf
        out.append((g * d).sum())
    return np.array(out).reshape(x.shape if elements is None else -1)


def capture_grad_by_differences(loss, x, elements=None):
    """d loss / d x in float64 by central differences, at x's flat
    elements given (all by default): loss(x') for an array x' shaped as x
    (e.g. the float64 reference attention's sum(d_o * o) with a modifier
    that reads x'). Independent of any formula."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.ravel()
    elements = range(x.size) if elements is None else elements
    out = []
    for e in elements:
        step = 1e-5 * max(1.0, abs(flat[e]))
        up, down = flat.copy(), flat.copy()
        up[e] += step
        down[e] -= step
        out.append((loss(up.reshape(x.shape)) - loss(down.reshape(x.shape)))
                   / (2 * step))
    return np.array(out)


# -- variable-length packing ---------------------------------------------------


def cu_seqlens(lengths):
    """int32 offsets [0, l0, l0 + l1, ...] of sequence lengths."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _sequence_mod(score_mod, b):
    """score_mod for sequence b alone (a [1, H, nq, nkv] problem): a
    function sees b as its batch index; a name is itself."""
    if callable(score_mod):
        return lambda s, _b, h, i, j: score_mod(s, b, h, i, j)
    return score_mod


def _sequences(cu_q, cu_k):
    for b in range(len(cu_q) - 1):
        yield b, slice(int(cu_q[b]), int(cu_q[b + 1])), slice(
            int(cu_k[b]), int(cu_k[b + 1]))


def _as_bhnd(x):
    """(n, H, d) -> (1, H, n, d) float64."""
    return np.asarray(x, dtype=np.float64).transpose(1, 0, 2)[None]


def varlen_attention_ref(q, k, v, cu_q, cu_k, scale=None, causal=False,
                         window=None, score_mod=None, max_q=None):
    """(o (total_q, H, dv), lse (B, H, max_q)) in float64 of packed q, k,
    v, each sequence on its own (visible_mask of its own lengths, so
    causal and windows bottom-right aligned per sequence; a modifier sees
    positions within the sequence and the sequence's index as b). A
    sequence without keys: o = 0, lse = -inf; lse's padding and o's rows
    of no sequence: -inf and 0."""
    T, H = np.shape(q)[0], np.shape(q)[1]
    Dv = np.shape(v)[2]
    lens = np.diff(np.asarray(cu_q, dtype=np.int64))
    max_q = max(int(lens.max()), 1) if max_q is None else max_q
    o = np.zeros((T, H, Dv))
    lse = np.full((len(cu_q) - 1, H, max_q), -np.inf)
    for b, sq, sk in _sequences(cu_q, cu_k):
        nq, nkv = sq.stop - sq.start, sk.stop - sk.start
        if nq == 0 or nkv == 0:
            continue
        vis = visible_mask(nq, nkv, causal, window)
        ob, lb = attention_ref(_as_bhnd(q[sq]), _as_bhnd(k[sk]),
                               _as_bhnd(v[sk]), scale, vis,
                               _sequence_mod(score_mod, b))
        o[sq] = ob[0].transpose(1, 0, 2)
        lse[b, :, :nq] = lb[0]
    return o, lse


def varlen_grads_ref(q, k, v, o, d_o, cu_q, cu_k, scale=None, causal=False,
                     window=None, score_mod=None):
    """(dq, dk, dv) in float64, packed as q, k, v, of
    varlen_attention_ref for upstream d_o (D from the o given, as
    attention_grads_ref); 0 in the rows of no sequence and wherever a
    sequence has no queries or no keys."""
    dq = np.zeros(np.shape(q))
    dk = np.zeros(np.shape(k))
    dv = np.zeros(np.shape(v))
    for b, sq, sk in _sequences(cu_q, cu_k):
        nq, nkv = sq.stop - sq.start, sk.stop - sk.start
        if nq == 0 or nkv == 0:
            continue
        vis = visible_mask(nq, nkv, causal, window)
        g = attention_grads_ref(
            _as_bhnd(q[sq]), _as_bhnd(k[sk]), _as_bhnd(v[sk]),
            _as_bhnd(o[sq]), _as_bhnd(d_o[sq]), scale, vis,
            _sequence_mod(score_mod, b))
        dq[sq], dk[sk], dv[sk] = (x[0].transpose(1, 0, 2) for x in g)
    return dq, dk, dv


def varlen_score_grads_ref(q, k, v, o, d_o, cu_q, cu_k, scale=None,
                           causal=False, score_mod=None):
    """score_grads_ref per sequence: a list of [H, nq, nkv] float64 arrays
    G_b = d loss / d s' (D from the o given), one per sequence."""
    out = []
    for b, sq, sk in _sequences(cu_q, cu_k):
        nq, nkv = sq.stop - sq.start, sk.stop - sk.start
        if nq == 0 or nkv == 0:
            out.append(np.zeros((np.shape(q)[1], nq, nkv)))
            continue
        vis = visible_mask(nq, nkv, causal)
        g = score_grads_ref(_as_bhnd(q[sq]), _as_bhnd(k[sk]),
                            _as_bhnd(v[sk]), _as_bhnd(d_o[sq]), scale, vis,
                            _sequence_mod(score_mod, b), o=_as_bhnd(o[sq]))
        out.append(g[0])
    return out
