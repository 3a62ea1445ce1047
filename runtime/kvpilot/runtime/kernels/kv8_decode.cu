// Paged decode attention over an 8-bit KV cache (int8 or fp8 e4m3 codes + fp32 per-token-head scales) on
// mma.sync tensor-core instructions with explicit register layouts (sm_89+). kv8_decode_cuda.py compiles it
// at run time with NVRTC (no CUDA headers needed) and these macros:
//   HEAD_DIM 64 | 128, GROUP (query heads per KV head, 1..8), KVH (the cache's KV heads), PAGE (a multiple
//   of 16), WARPS,
//   KV_INT8 (1: int8 codes, 0: e4m3), OUT_BF16 (1: bf16 q/out, 0: fp16), SPLIT (1: split-KV partials),
//   MIN_BLOCKS (CTAs per SM the register allocation must allow), PREFETCH (1: a chunk's loads ahead).
// Grid (num_splits, num_kv_heads, num_seqs); one CTA per partition, its WARPS warps taking the partition's
// 16-position chunks in turn (chunk c -> warp c % WARPS), merged through shared memory at the end. Outputs as
// decode_attention_triton._decode_kernel's (single pass: out; split: partials its reduce kernel merges).
//
// Why by hand: Triton's dots stage 8-bit tiles through shared memory and re-layout them (bar.sync each), and
// they cost more than the bytes (BENCHMARKS.md, 8-bit decode). Here every byte goes from global memory into
// the register that the mma reads, because the dot's reduction index may be permuted freely:
//  - QK, S[head, pos] = q[head, :] . K[pos, :] (A = q, 16 rows of which GROUP are real; B = K^T): lane
//    (g = lane / 4, t = lane % 4) loads K rows g and 8 + g of the chunk, bytes [t*HEAD_DIM/4, +HEAD_DIM/4),
//    and q's head g holds the same dims in the same order. int8: m16n8k32 s8 x s8 (q quantized per head to
//    int8, as the Triton kernel's native path); e4m3: K widened to fp16 by cvt (exact), m16n8k16 fp16.
//  - PV transposed, O^T[dim, head] = V^T[dim, pos] . P^T[pos, head] (m16n8k16 fp16; 16 dims per mma, every
//    row real): S's accumulator fragment of two n-tiles is P^T's B fragment as it stands; lane (g, t) loads
//    V rows 2t, 2t+1, 8+2t, 9+2t, bytes [g*VB, +VB) (VB = HEAD_DIM / 8), and m-tile i's rows g, g + 8 are
//    dims g*VB + 2i, g*VB + 2i + 1. The accumulator holds heads 2t, 2t + 1 of those dims.
// Scales: K's multiplies its position's score; V's multiplies its position's softmax weight, divided by the
// running maximum V scale (so the fp16 weights stay in [0, 1]; acc is kept in units of that maximum).
// int8 V is widened by the 0x6400 bias (fp16 1152 + code, exact); the 1152 * sum(weights) it adds to each
// output is subtracted at the end, from the fp16-rounded weights the mma saw.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif

#define KB (HEAD_DIM / 4)  // K bytes per lane per row
#define VB (HEAD_DIM / 8)  // V bytes per lane per row
#define KW (KB / 4)        // ... as 32-bit words
#define VW (VB / 4)
#define MT (VB / 2)  // PV m-tiles (16 dims each)
#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2(float x) {
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float in_to_float(u16 x) {
#if OUT_BF16
    return __uint_as_float(((u32)x) << 16);
#else
    float y;
    asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(x));
    return y;
#endif
}

__device__ __forceinline__ u16 float_to_out(float x) {
    u16 y;
#if OUT_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(y) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(y) : "f"(x));
#endif
    return y;
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 y;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(y) : "f"(hi), "f"(lo));
    return y;
}

__device__ __forceinline__ float2 unpack_f16x2(u32 x) {
    float lo, hi;
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
        : "=f"(lo), "=f"(hi) : "r"(x));
    return make_float2(lo, hi);
}

// two e4m3 codes (the low 16 bits of x: low byte -> low half) -> fp16x2, exactly
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 x) {
    u32 y;
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(y) : "r"(x));
    return y;
}

__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 sel) {
    u32 y;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(y) : "r"(a), "r"(b), "r"(sel));
    return y;
}

// c += A . B on one 16 x 8 tile (fp16 in, fp32 accumulate); a: 4 registers, b: 2
__device__ __forceinline__ void mma_f16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_s8(int* c, u32 a0, u32 a2, u32 b0, u32 b1) {  // A's rows 8..15 zero
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

template <int N>
__device__ __forceinline__ void load_words(const u8* p, u32* w) {
    if (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            uint4 x = reinterpret_cast<const uint4*>(p)[i / 4];
            w[i] = x.x, w[i + 1] = x.y, w[i + 2] = x.z, w[i + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            uint2 x = reinterpret_cast<const uint2*>(p)[i / 2];
            w[i] = x.x, w[i + 1] = x.y;
        }
    }
}

// The caches are contiguous ([num_blocks, PAGE, KVH, HEAD_DIM] codes, [num_blocks, PAGE, KVH] scales), so every
// stride is a compile-time constant: a chunk's loads are one lane base per tensor plus immediate offsets.
#define SLOT (KVH * HEAD_DIM)  // bytes from one slot of a page to the next
#define BLOCK (PAGE * SLOT)    // ... one page to the next

// This lane's view of one KV head's pages (its KV head and lane offsets folded into the bases).
struct Lane {
    const u8* k;     // + row g's bytes [t * KB, +KB)
    const u8* v;     // + row 2t's bytes [g * VB, +VB)
    const float* s;  // k_scale + position 2t's scale (v_scale: + vs_delta)
    long long vs_delta;
    int t;
};

// One chunk's codes and scales in this lane's registers.
struct Chunk {
    u32 k[2][KW];        // K rows g, 8 + g
    u32 v[4][VW];        // V rows 2t, 2t + 1, 8 + 2t, 9 + 2t
    float ks[4], vs[4];  // scales of positions 2t, 2t + 1, 8 + 2t, 9 + 2t
};

__device__ __forceinline__ void load_chunk(Chunk& ch, const Lane& L, int page, int in_page, int valid) {
    const long long slot0 = (long long)page * PAGE + in_page;
    const u8* kp = L.k + slot0 * SLOT;
    const u8* vp = L.v + slot0 * SLOT;
    const float* sp = L.s + slot0 * KVH;
    const int vrow[4] = {0, 1, 8, 9};  // + 2t
#pragma unroll
    for (int r = 0; r < 2; ++r) load_words<KW>(kp + 8 * r * SLOT, ch.k[r]);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        load_words<VW>(vp + vrow[r] * SLOT, ch.v[r]);
        ch.ks[r] = sp[vrow[r] * KVH];
        ch.vs[r] = sp[vrow[r] * KVH + L.vs_delta];
    }
    if (valid < 16) {  // the last chunk: rows past the context's end are zeroed (a page's unwritten slots
        // may hold NaN codes, and a zero weight does not cancel a NaN in the dot)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (vrow[r] + 2 * L.t >= valid) {
#pragma unroll
                for (int i = 0; i < VW; ++i) ch.v[r][i] = 0u;
                ch.vs[r] = 0.f;
            }
        }
    }
}

// Running state of one warp. QK layout (lane g: head g): m, l, wsum; PV layout (lane t: heads 2t, 2t + 1):
// acc; vref is the warp's.
struct State {
    float acc[MT][4];  // m-tile i: (dim g*VB + 2i: heads 2t, 2t+1), (dim g*VB + 2i + 1: heads 2t, 2t+1)
    float m, l, vref, wsum;  // max score (base 2), this lane's sum of weights, max V scale, fp16 weights' sum
};

__device__ __forceinline__ void scores(const Chunk& ch, const u32* qa, float row_scale, float s[4]) {
    // s[i]: head g's score of position 2t, 2t+1, 8+2t, 9+2t (n-tile 0: K row g; n-tile 1: K row 8 + g)
#if KV_INT8
    int c[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int j = 0; j < KW / 2; ++j) mma_s8(c[n], qa[2 * j], qa[2 * j + 1], ch.k[n][2 * j], ch.k[n][2 * j + 1]);
    }
    const float raw[4] = {(float)c[0][0], (float)c[0][1], (float)c[1][0], (float)c[1][1]};
#else
    float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int j = 0; j < KW; ++j) mma_f16(c[n], qa[2 * j], 0u, qa[2 * j + 1], 0u, e4m3x2_to_f16x2(ch.k[n][j]),
                                             e4m3x2_to_f16x2(ch.k[n][j] >> 16));
    }
    const float raw[4] = {c[0][0], c[0][1], c[1][0], c[1][1]};
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = raw[i] * row_scale * ch.ks[i];
}

__device__ __forceinline__ float max4_lanes(float a, float b, float c, float d) {
    float x = fmaxf(fmaxf(a, b), fmaxf(c, d));
    x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL, x, 2));
}

// V^T's A fragments of m-tile i: (rows 2t, 2t+1 | 8+2t, 9+2t) x (dims g*VB + 2i, + 1) -> 4 fp16x2
__device__ __forceinline__ void v_fragment(const Chunk& ch, int i, u32* a) {
    const int w = i >> 1, b = 2 * (i & 1);  // byte 2i of the lane's VB bytes
#if KV_INT8  // [x, -, y, -] -> fp16 pair (1152 + x, 1152 + y)
    const u32 sel0 = b | ((4 + b) << 8), sel1 = (b + 1) | ((5 + b) << 8);
    a[0] = (byte_perm(ch.v[0][w], ch.v[1][w], sel0) & 0x00FF00FFu) ^ 0x64806480u;
    a[1] = (byte_perm(ch.v[0][w], ch.v[1][w], sel1) & 0x00FF00FFu) ^ 0x64806480u;
    a[2] = (byte_perm(ch.v[2][w], ch.v[3][w], sel0) & 0x00FF00FFu) ^ 0x64806480u;
    a[3] = (byte_perm(ch.v[2][w], ch.v[3][w], sel1) & 0x00FF00FFu) ^ 0x64806480u;
#else  // [x0, y0, x1, y1] -> fp16 pairs (x0, y0), (x1, y1)
    const u32 sel = b | ((4 + b) << 4) | ((b + 1) << 8) | ((5 + b) << 12);
    const u32 lo = byte_perm(ch.v[0][w], ch.v[1][w], sel), hi = byte_perm(ch.v[2][w], ch.v[3][w], sel);
    a[0] = e4m3x2_to_f16x2(lo), a[1] = e4m3x2_to_f16x2(lo >> 16);
    a[2] = e4m3x2_to_f16x2(hi), a[3] = e4m3x2_to_f16x2(hi >> 16);
#endif
}

__device__ __forceinline__ void attend(State& st, const Chunk& ch, const u32* qa, float row_scale, int valid,
                                       int t) {
    float s[4];
    scores(ch, qa, row_scale, s);
    const int pos[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = pos[i] < valid ? s[i] : NEG_INF;
    const float m_new = fmaxf(st.m, max4_lanes(s[0], s[1], s[2], s[3]));  // finite: position 0 is valid
    const float vmax = fmaxf(st.vref, max4_lanes(ch.vs[0], ch.vs[1], ch.vs[2], ch.vs[3]));
    const float inv_v = vmax > 0.f ? rcp(vmax) : 0.f;
    // head g's factor on everything accumulated so far: the softmax max and the V-scale unit moved
    const float alpha = ex2(st.m - m_new), rescale = alpha * (vmax > 0.f ? st.vref * inv_v : 1.f);
    float p[4], w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p[i] = ex2(s[i] - m_new);
        w[i] = p[i] * ch.vs[i] * inv_v;
    }
    st.l = st.l * alpha + (p[0] + p[1]) + (p[2] + p[3]);
    st.m = m_new;
    st.vref = vmax;
    const u32 b0 = pack_f16x2(w[0], w[1]), b1 = pack_f16x2(w[2], w[3]);
#if KV_INT8
    const float2 w01 = unpack_f16x2(b0), w23 = unpack_f16x2(b1);
    st.wsum = st.wsum * rescale + (w01.x + w01.y) + (w23.x + w23.y);
#endif
    if (__any_sync(FULL, rescale != 1.f)) {  // rare once the maxima settle: acc holds heads 2t, 2t + 1
        const float r0 = __shfl_sync(FULL, rescale, 8 * t), r1 = __shfl_sync(FULL, rescale, 8 * t + 4);
#pragma unroll
        for (int i = 0; i < MT; ++i) st.acc[i][0] *= r0, st.acc[i][1] *= r1, st.acc[i][2] *= r0, st.acc[i][3] *= r1;
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        u32 a[4];
        v_fragment(ch, i, a);
        mma_f16(st.acc[i], a[0], a[1], a[2], a[3], b0, b1);
    }
}

__device__ __forceinline__ int partition_for(int ctx, int min_partition, int num_splits, int tile) {
    const int per = (ctx + num_splits - 1) / num_splits;
    const int rounded = (per + tile - 1) / tile * tile;
    return rounded > min_partition ? rounded : min_partition;
}

// q's head g, dims [t * KB, +KB), as the QK dot's A fragments (int8: quantized per head; fp16: q / amax).
// Returns the factor that turns the dot into q . k.
__device__ __forceinline__ float load_q(const u16* qp, bool real, u32* qa) {
    float qf[KB];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < KB; i += 2) {
        const u32 pair = real ? *reinterpret_cast<const u32*>(qp + i) : 0u;
        qf[i] = in_to_float((u16)(pair & 0xFFFFu)), qf[i + 1] = in_to_float((u16)(pair >> 16));
        amax = fmaxf(amax, fmaxf(fabsf(qf[i]), fabsf(qf[i + 1])));
    }
    amax = fmaxf(amax, __shfl_xor_sync(FULL, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(FULL, amax, 2));
#if KV_INT8
    const float step = amax > 0.f ? amax / 127.f : 1.f, inv = amax > 0.f ? 127.f / amax : 0.f;
#pragma unroll
    for (int i = 0; i < KW; ++i) {  // word i: dims 4i .. 4i + 3 (a0, a2 of k-step i / 2)
        u32 word = 0u;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const float y = qf[4 * i + b] * inv;
            const int code = (int)truncf(y + (y >= 0.f ? 0.5f : -0.5f));  // half away from 0, as the store
            word |= ((u32)(code & 0xFF)) << (8 * b);
        }
        qa[i] = word;
    }
#else
    const float step = amax > 0.f ? amax : 1.f, inv = amax > 0.f ? 1.f / amax : 0.f;
#pragma unroll
    for (int i = 0; i < 2 * KW; ++i) qa[i] = pack_f16x2(qf[2 * i] * inv, qf[2 * i + 1] * inv);  // dims 2i, 2i+1
#endif
    return step;
}

// q [num_seqs, num_heads, HEAD_DIM] (16-bit), caches [num_blocks, PAGE, KVH, HEAD_DIM] (8-bit, contiguous),
// scales [num_blocks, PAGE, KVH] fp32 (contiguous), out like q; part_out [num_seqs, num_heads, num_splits,
// HEAD_DIM] and part_lse [num_seqs, num_heads, num_splits] fp32 (SPLIT). qk_scale_bits: the float32 bits of
// softmax scale * log2(e).
extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) kv8_decode(
    const u16* __restrict__ q, const u8* __restrict__ k_cache, const u8* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale, u16* __restrict__ out,
    float* __restrict__ part_out, float* __restrict__ part_lse, const int* __restrict__ context_lens,
    const int* __restrict__ block_tables, int qk_scale_bits, int partition_size, int num_splits, int tile,
    int num_heads, int stride_qs, int stride_qh, int stride_os, int stride_oh, int stride_bt) {
    const int split = blockIdx.x, kv_head = blockIdx.y, seq = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int ctx = context_lens[seq];
    const int part = partition_for(ctx, partition_size, num_splits, tile);
    const int start = split * part;
    if (SPLIT && start >= ctx) return;  // past the sequence's end: the reduce ignores this partition
    const int end = min(start + part, ctx);

    const int head = kv_head * GROUP + (g < GROUP ? g : 0);
    u32 qa[KV_INT8 ? KW : 2 * KW];
    const float row_scale =
        load_q(q + (long long)seq * stride_qs + (long long)head * stride_qh + t * KB, g < GROUP, qa) *
        __int_as_float(qk_scale_bits);

    Lane L;
    L.k = k_cache + (long long)kv_head * HEAD_DIM + g * SLOT + t * KB;
    L.v = v_cache + (long long)kv_head * HEAD_DIM + 2 * t * SLOT + g * VB;
    L.s = k_scale + kv_head + 2 * t * KVH;
    L.vs_delta = v_scale - k_scale;
    L.t = t;
    const int* bt = block_tables + (long long)seq * stride_bt;

    State st;
    st.m = NEG_INF, st.l = 0.f, st.vref = 0.f, st.wsum = 0.f;
#pragma unroll
    for (int i = 0; i < MT; ++i) st.acc[i][0] = st.acc[i][1] = st.acc[i][2] = st.acc[i][3] = 0.f;

    // chunks of 16 positions from start (partitions are whole tiles of >= 16, so a chunk is in one page)
    const int n_chunks = (end - start + 15) / 16;
    int chunk = warp;
#if PREFETCH  // the next chunk's loads are in flight while this one is computed
    Chunk cur, nxt;
    if (chunk < n_chunks) {
        const int p0 = start + 16 * chunk;
        load_chunk(cur, L, bt[p0 / PAGE], p0 % PAGE, min(16, end - p0));
    }
    for (; chunk < n_chunks; chunk += WARPS) {
        const int p0 = start + 16 * chunk, nc = chunk + WARPS;
        if (nc < n_chunks) {
            const int p1 = start + 16 * nc;
            load_chunk(nxt, L, bt[p1 / PAGE], p1 % PAGE, min(16, end - p1));
        }
        attend(st, cur, qa, row_scale, min(16, end - p0), t);
        cur = nxt;
    }
#else  // fewer registers, more warps per SM: the other warps' loads are in flight; only the next chunk's
    // page id is loaded ahead, so a chunk's loads wait on one memory latency, not two
    int page = chunk < n_chunks ? bt[(start + 16 * chunk) / PAGE] : 0;
    for (; chunk < n_chunks; chunk += WARPS) {
        const int p0 = start + 16 * chunk, nc = chunk + WARPS;
        const int next_page = nc < n_chunks ? bt[(start + 16 * nc) / PAGE] : 0;
        Chunk cur;
        load_chunk(cur, L, page, p0 % PAGE, min(16, end - p0));
        attend(st, cur, qa, row_scale, min(16, end - p0), t);
        page = next_page;
    }
#endif

    // per head (QK layout): the sums over the four lanes of a head
    float l = st.l + __shfl_xor_sync(FULL, st.l, 1);
    l += __shfl_xor_sync(FULL, l, 2);
#if KV_INT8  // the 0x6400 bias added 1152 to every V code: subtract 1152 * (the fp16 weights' sum) per head
    float wsum = st.wsum + __shfl_xor_sync(FULL, st.wsum, 1);
    wsum += __shfl_xor_sync(FULL, wsum, 2);
    const float bias0 = 1152.f * __shfl_sync(FULL, wsum, 8 * t), bias1 = 1152.f * __shfl_sync(FULL, wsum, 8 * t + 4);
#pragma unroll
    for (int i = 0; i < MT; ++i) st.acc[i][0] -= bias0, st.acc[i][1] -= bias1, st.acc[i][2] -= bias0, st.acc[i][3] -= bias1;
#endif

    // merge the warps: out = sum_w 2^(m_w - M) vref_w acc_w / sum_w 2^(m_w - M) l_w
    __shared__ float sm_m[WARPS][8], sm_l[WARPS][8], sm_v[WARPS];
    __shared__ float sm_acc[WARPS][GROUP][HEAD_DIM];
    if (t == 0 && g < GROUP) sm_m[warp][g] = st.m, sm_l[warp][g] = l;
    if (lane == 0) sm_v[warp] = st.vref;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (2 * t + h < GROUP) {
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                sm_acc[warp][2 * t + h][g * VB + 2 * i] = st.acc[i][h];
                sm_acc[warp][2 * t + h][g * VB + 2 * i + 1] = st.acc[i][2 + h];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += WARPS * 32) {
        const int h = i / HEAD_DIM, dim = i % HEAD_DIM;
        float big = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) big = fmaxf(big, sm_m[w][h]);
        float num = 0.f, den = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float e = sm_m[w][h] == NEG_INF ? 0.f : ex2(sm_m[w][h] - big);  // warps with no chunk
            num += e * sm_v[w] * sm_acc[w][h][dim];
            den += e * sm_l[w][h];
        }
        const long long row = (long long)seq * num_heads + kv_head * GROUP + h;
        if (SPLIT) {
            part_out[(row * num_splits + split) * HEAD_DIM + dim] = den > 0.f ? num / den : 0.f;
            if (dim == 0) part_lse[row * num_splits + split] = big + lg2(den);
        } else {
            const float o = den > 0.f ? num / den : 0.f;  // context 0 (padding rows) -> zeros
            out[(long long)seq * stride_os + (long long)(kv_head * GROUP + h) * stride_oh + dim] = float_to_out(o);
        }
    }
}
