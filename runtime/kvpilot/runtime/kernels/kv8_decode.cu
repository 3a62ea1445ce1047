// Paged decode attention over an 8-bit KV cache (int8 or fp8 e4m3 codes + fp32 per-token-head scales) on
// mma.sync tensor-core instructions with explicit register layouts (sm_89+). kv8_decode_cuda.py compiles it
// at run time with NVRTC (no CUDA headers needed) and these macros:
//   HEAD_DIM 64 | 128, GROUP (query heads per KV head, 1..8), PAGE (a multiple of 16), WARPS,
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
//  - PV, O[head, dim] = P[head, pos] . V[pos, dim] (m16n8k16 fp16): S's accumulator fragment of two n-tiles
//    is P's A fragment as it stands; lane (g, t) loads V rows 2t, 2t+1, 8+2t, 9+2t, bytes [g*VB, +VB)
//    (VB = HEAD_DIM / 8), and n-tile d's column c is dim c * VB + d.
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
#define VB (HEAD_DIM / 8)  // V bytes per lane per row (= PV n-tiles)
#define KW (KB / 4)        // ... as 32-bit words
#define VW (VB / 4)
#define NEG_INF __int_as_float(0xff800000)

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
    asm volatile("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(y) : "r"(x));
    return y;
}

__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 sel) {
    u32 y;
    asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(y) : "r"(a), "r"(b), "r"(sel));
    return y;
}

// D = A . B + C on 16 x 8 tiles; only the accumulator rows 0..7 (c0, c1) are real: A's rows 8..15 are zero
__device__ __forceinline__ void mma_f16(float& c0, float& c1, u32 a0, u32 a2, u32 b0, u32 b1) {
    float d2, d3;  // rows 8..15: discarded
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(c0), "=f"(c1), "=f"(d2), "=f"(d3)
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(0.f), "f"(0.f));
}

__device__ __forceinline__ void mma_s8(int& c0, int& c1, u32 a0, u32 a2, u32 b0, u32 b1) {
    int d2, d3;  // rows 8..15: discarded
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(c0), "=r"(c1), "=r"(d2), "=r"(d3)
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(0), "r"(0));
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

struct Cache {
    const u8* k;
    const u8* v;
    const float* ks;
    const float* vs;
    int skb, sks, svb, svs, ssb, sss;  // strides (elements) of blocks and slots; the KV head is folded in
};

// One chunk's codes and scales in this lane's registers.
struct Chunk {
    u32 k[2][KW];  // K rows g, 8 + g
    u32 v[4][VW];  // V rows 2t, 2t + 1, 8 + 2t, 9 + 2t
    float ks[4], vs[4];  // scales of positions 2t, 2t + 1, 8 + 2t, 9 + 2t
};

__device__ __forceinline__ void load_chunk(Chunk& ch, const Cache& c, int page, int in_page, int valid,
                                           int g, int t) {
    // valid: positions of the chunk below the context's end (1..16); rows past it are zeroed: a page's
    // unwritten slots may hold NaN codes, and a zero weight does not cancel a NaN in the dot
    const long long kb = (long long)page * c.skb, vb = (long long)page * c.svb;
    const long long sb = (long long)page * c.ssb;
    const int krow[2] = {g, 8 + g};
    const int vrow[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        load_words<KW>(c.k + kb + (long long)(in_page + krow[r]) * c.sks + t * KB, ch.k[r]);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int slot = in_page + vrow[r];
        load_words<VW>(c.v + vb + (long long)slot * c.svs + g * VB, ch.v[r]);
        ch.ks[r] = c.ks[sb + (long long)slot * c.sss];
        ch.vs[r] = c.vs[sb + (long long)slot * c.sss];
        if (vrow[r] >= valid) {
#pragma unroll
            for (int i = 0; i < VW; ++i) ch.v[r][i] = 0u;
            ch.vs[r] = 0.f;
        }
    }
}

// Running state of one warp for query head g (lanes of one g hold the same m and vref).
struct State {
    float acc[VB][2];  // out[g, c * VB + d] for c = 2t, 2t + 1, in units of vref
    float m, l, vref, wsum;  // max score (base 2), this lane's sum of weights, max V scale, fp16 weights' sum
};

__device__ __forceinline__ void scores(const Chunk& ch, const u32* qa, int t, float row_scale, float s[4]) {
    // s[i]: score of position 2t, 2t+1, 8+2t, 9+2t (n-tile 0: K row g; n-tile 1: K row 8 + g)
#if KV_INT8
    int c[2][2] = {{0, 0}, {0, 0}};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int j = 0; j < KW / 2; ++j) mma_s8(c[n][0], c[n][1], qa[2 * j], qa[2 * j + 1], ch.k[n][2 * j],
                                                  ch.k[n][2 * j + 1]);
    }
    const float raw[4] = {(float)c[0][0], (float)c[0][1], (float)c[1][0], (float)c[1][1]};
#else
    float c[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int j = 0; j < KW; ++j) mma_f16(c[n][0], c[n][1], qa[2 * j], qa[2 * j + 1],
                                             e4m3x2_to_f16x2(ch.k[n][j]), e4m3x2_to_f16x2(ch.k[n][j] >> 16));
    }
    const float raw[4] = {c[0][0], c[0][1], c[1][0], c[1][1]};
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = raw[i] * row_scale * ch.ks[i];
}

__device__ __forceinline__ float max4_lanes(float a, float b, float c, float d) {
    float x = fmaxf(fmaxf(a, b), fmaxf(c, d));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ void attend(State& st, const Chunk& ch, const u32* qa, int t, float row_scale,
                                       int valid) {
    float s[4];
    scores(ch, qa, t, row_scale, s);
    const int pos[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = pos[i] < valid ? s[i] : NEG_INF;
    const float m_new = fmaxf(st.m, max4_lanes(s[0], s[1], s[2], s[3]));  // finite: position 0 is valid
    const float vmax = fmaxf(st.vref, max4_lanes(ch.vs[0], ch.vs[1], ch.vs[2], ch.vs[3]));
    const float alpha = ex2(st.m - m_new);
    const float inv_v = vmax > 0.f ? 1.f / vmax : 0.f;
    const float rescale = alpha * (vmax > 0.f ? st.vref * inv_v : 1.f);
    float p[4], w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p[i] = ex2(s[i] - m_new);
        w[i] = p[i] * ch.vs[i] * inv_v;
    }
    st.l = st.l * alpha + (p[0] + p[1]) + (p[2] + p[3]);
    st.m = m_new;
    st.vref = vmax;
    const u32 a0 = pack_f16x2(w[0], w[1]), a2 = pack_f16x2(w[2], w[3]);
#if KV_INT8
    const float2 w01 = unpack_f16x2(a0), w23 = unpack_f16x2(a2);
    st.wsum = st.wsum * rescale + (w01.x + w01.y) + (w23.x + w23.y);
#endif
#pragma unroll
    for (int d = 0; d < VB; ++d) {
#if KV_INT8  // bytes [a_d, -, b_d, -] -> fp16 pair (1152 + a, 1152 + b)
        const u32 sel = (d & 3) | ((4 + (d & 3)) << 8);
        const u32 b0 = (byte_perm(ch.v[0][d >> 2], ch.v[1][d >> 2], sel) & 0x00FF00FFu) ^ 0x64806480u;
        const u32 b1 = (byte_perm(ch.v[2][d >> 2], ch.v[3][d >> 2], sel) & 0x00FF00FFu) ^ 0x64806480u;
#else  // bytes [a_d, b_d] -> fp16 pair (a, b)
        const u32 sel = (d & 3) | ((4 + (d & 3)) << 4);
        const u32 b0 = e4m3x2_to_f16x2(byte_perm(ch.v[0][d >> 2], ch.v[1][d >> 2], sel));
        const u32 b1 = e4m3x2_to_f16x2(byte_perm(ch.v[2][d >> 2], ch.v[3][d >> 2], sel));
#endif
        st.acc[d][0] *= rescale;
        st.acc[d][1] *= rescale;
        mma_f16(st.acc[d][0], st.acc[d][1], a0, a2, b0, b1);
    }
}

__device__ __forceinline__ int partition_for(int ctx, int min_partition, int num_splits, int tile) {
    const int per = (ctx + num_splits - 1) / num_splits;
    const int rounded = (per + tile - 1) / tile * tile;
    return rounded > min_partition ? rounded : min_partition;
}

// q [num_seqs, num_heads, HEAD_DIM] (16-bit), caches [num_blocks, PAGE, num_kv_heads, HEAD_DIM] (8-bit),
// scales [num_blocks, PAGE, num_kv_heads] fp32, out like q; part_out [num_seqs, num_heads, num_splits,
// HEAD_DIM] and part_lse [num_seqs, num_heads, num_splits] fp32 (SPLIT). qk_scale_bits: the float32 bits of
// softmax scale * log2(e).
extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) kv8_decode(
    const u16* __restrict__ q, const u8* __restrict__ k_cache, const u8* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale, u16* __restrict__ out,
    float* __restrict__ part_out, float* __restrict__ part_lse, const int* __restrict__ context_lens,
    const int* __restrict__ block_tables, int qk_scale_bits, int partition_size, int num_splits, int tile,
    int num_heads, int stride_qs, int stride_qh, int stride_os, int stride_oh, int stride_kb, int stride_ks,
    int stride_kh, int stride_vb, int stride_vs, int stride_vh, int stride_sb, int stride_ss, int stride_sh,
    int stride_bt) {
    const int split = blockIdx.x, kv_head = blockIdx.y, seq = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int ctx = context_lens[seq];
    const int part = partition_for(ctx, partition_size, num_splits, tile);
    const int start = split * part;
    if (SPLIT && start >= ctx) return;  // past the sequence's end: the reduce ignores this partition
    const int end = min(start + part, ctx);

    // q's head g, dims [t * KB, +KB), scaled per head (int8: to the int8 grid; fp16: to |q| <= 1)
    const int head = kv_head * GROUP + (g < GROUP ? g : 0);
    float qf[KB];
    const u16* qp = q + (long long)seq * stride_qs + (long long)head * stride_qh + t * KB;
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < KB; ++i) {
        qf[i] = g < GROUP ? in_to_float(qp[i]) : 0.f;
        amax = fmaxf(amax, fabsf(qf[i]));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
#if KV_INT8
    const float q_step = amax > 0.f ? amax / 127.f : 1.f;
    u32 qa[KW];  // word i: q codes of dims t * KB + 4i .. +3 (int8 A fragments: a0, a2 of k-step i / 2)
#pragma unroll
    for (int i = 0; i < KW; ++i) {
        u32 word = 0u;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const float y = qf[4 * i + b] / q_step;
            const int code = (int)truncf(y + (y >= 0.f ? 0.5f : -0.5f));  // half away from 0, as the store
            word |= ((u32)(code & 0xFF)) << (8 * b);
        }
        qa[i] = word;
    }
#else
    const float q_step = amax > 0.f ? amax : 1.f;
    u32 qa[2 * KW];  // word i: q / amax of dims t * KB + 2i, +1 (fp16 A fragments: a0, a2 of k-step i / 2)
#pragma unroll
    for (int i = 0; i < 2 * KW; ++i) qa[i] = pack_f16x2(qf[2 * i] / q_step, qf[2 * i + 1] / q_step);
#endif
    const float row_scale = q_step * __int_as_float(qk_scale_bits);

    Cache c;
    c.k = k_cache + (long long)kv_head * stride_kh;
    c.v = v_cache + (long long)kv_head * stride_vh;
    c.ks = k_scale + (long long)kv_head * stride_sh;
    c.vs = v_scale + (long long)kv_head * stride_sh;
    c.skb = stride_kb, c.sks = stride_ks, c.svb = stride_vb, c.svs = stride_vs;
    c.ssb = stride_sb, c.sss = stride_ss;
    const int* bt = block_tables + (long long)seq * stride_bt;

    State st;
    st.m = NEG_INF, st.l = 0.f, st.vref = 0.f, st.wsum = 0.f;
#pragma unroll
    for (int d = 0; d < VB; ++d) st.acc[d][0] = st.acc[d][1] = 0.f;

    // chunks of 16 positions from start (partitions are whole tiles of >= 16, so a chunk is in one page)
    const int n_chunks = (end - start + 15) / 16;
    int chunk = warp;
#if PREFETCH  // the next chunk's loads are in flight while this one is computed
    Chunk cur, nxt;
    if (chunk < n_chunks) {
        const int p0 = start + 16 * chunk;
        load_chunk(cur, c, bt[p0 / PAGE], p0 % PAGE, min(16, end - p0), g, t);
    }
    for (; chunk < n_chunks; chunk += WARPS) {
        const int p0 = start + 16 * chunk, nc = chunk + WARPS;
        if (nc < n_chunks) {
            const int p1 = start + 16 * nc;
            load_chunk(nxt, c, bt[p1 / PAGE], p1 % PAGE, min(16, end - p1), g, t);
        }
        attend(st, cur, qa, t, row_scale, min(16, end - p0));
        cur = nxt;
    }
#else  // fewer registers, more warps per SM: the other warps' loads are in flight
    for (; chunk < n_chunks; chunk += WARPS) {
        const int p0 = start + 16 * chunk;
        Chunk cur;
        load_chunk(cur, c, bt[p0 / PAGE], p0 % PAGE, min(16, end - p0), g, t);
        attend(st, cur, qa, t, row_scale, min(16, end - p0));
    }
#endif

#if KV_INT8  // the 0x6400 bias added 1152 to every V code: each lane's acc summed the weights of all four
    // lanes of its head (the mma's k), so the correction is their sum
    float wsum = st.wsum + __shfl_xor_sync(0xffffffffu, st.wsum, 1);
    wsum += __shfl_xor_sync(0xffffffffu, wsum, 2);
#pragma unroll
    for (int d = 0; d < VB; ++d) {
        st.acc[d][0] -= 1152.f * wsum;
        st.acc[d][1] -= 1152.f * wsum;
    }
#endif
    float l = st.l + __shfl_xor_sync(0xffffffffu, st.l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);

    // merge the warps: out = sum_w 2^(m_w - M) vref_w acc_w / sum_w 2^(m_w - M) l_w
    __shared__ float sm_m[WARPS][8], sm_l[WARPS][8], sm_v[WARPS][8];
    __shared__ float sm_acc[WARPS][GROUP][HEAD_DIM];
    if (t == 0 && g < GROUP) sm_m[warp][g] = st.m, sm_l[warp][g] = l, sm_v[warp][g] = st.vref;
    if (g < GROUP) {
#pragma unroll
        for (int d = 0; d < VB; ++d) {
            sm_acc[warp][g][(2 * t) * VB + d] = st.acc[d][0];
            sm_acc[warp][g][(2 * t + 1) * VB + d] = st.acc[d][1];
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
            num += e * sm_v[w][h] * sm_acc[w][h][dim];
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
