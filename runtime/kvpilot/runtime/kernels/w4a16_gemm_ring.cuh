// w4a16_gemm.cu's cp.async ring: where a K tile's x rows, weight words and group words sit in a stage, and
// what each thread copies of every tile. Included where STAGES, X_STAGE, W_STAGE, W_WARP_BYTES, WORD_ROWS,
// SZ_BYTES, BN, BM, NT_PAIRS, TILES_PER_GROUP, GROUPS_PER_TILE, OFFSETS, WGMMA and cp_async16 are defined.
#pragma once

// Chunk (row r, 4-column chunk a of the warp's 8) of a warp's weight stage: grouped by the read that takes it
// ((r / 8, r % 2, a / 4): 8 reads of 16 chunks, 16 for int8's 32 rows), then by (t = r % 8 / 2, a % 4), so
// each read's 32 lanes take 256 consecutive bytes (no bank conflict).
__device__ __forceinline__ int w_chunk(int r, int a) {
    return ((((r >> 3) * 2 + (r & 1)) * 2 + (a >> 2)) * 16) + ((r & 7) >> 1) * 4 + (a & 3);
}

// Byte offset of x's 16-byte chunk kc (K rows 8 kc..) of token row tok in a stage: rows of 256 bytes, chunk
// kc at kc ^ tok % 8 (ldmatrix's 8 rows hit 8 bank groups); for WGMMA two K halves of 128-byte rows, chunk
// kc % 8 at (kc % 8) ^ tok % 8: the 128-byte swizzle of the wgmma descriptor (w4a16_gemm_wgmma.cuh).
#if WGMMA
#define X_ROW_BYTES 128
__device__ __forceinline__ int x_stage_offset(int tok, int kc) {
    return (kc >> 3) * (BM * X_ROW_BYTES) + tok * X_ROW_BYTES + (((kc & 7) ^ (tok & 7)) << 4);
}
#else
#define X_ROW_BYTES 256
__device__ __forceinline__ int x_stage_offset(int tok, int kc) { return tok * X_ROW_BYTES + ((kc ^ (tok & 7)) << 4); }
#endif

// Stage i of the ring: where its weight words and group words are (at + X_STAGE, as the readers take it) and
// where its x is. One block per stage; for WGMMA every stage's x first (X_STAGE apiece, a multiple of 1 KB, so
// each starts on a swizzle atom once the ring does), then the weights.
#if WGMMA
__device__ __forceinline__ char* stage_at(char* smem, int i) {
    return smem + STAGES * X_STAGE + i * (W_STAGE + SZ_STAGE) - X_STAGE;
}
__device__ __forceinline__ char* x_at(char* smem, int i) { return smem + i * X_STAGE; }
#else
__device__ __forceinline__ char* stage_at(char* smem, int i) { return smem + i * STAGE_BYTES; }
__device__ __forceinline__ char* x_at(char* smem, int i) { return smem + i * STAGE_BYTES; }
#endif

// What one thread copies of each K tile, fixed for the whole K loop (the addresses are worked out once: the
// copies of a tile are then a few instructions each). The CTA's 16 word rows x BN columns: chunk (r, a) to
// w_chunk order in the warp's region of column chunk a, rows r0 + 4k (k < 4) of one column chunk a per
// thread; x: rows tok0 + X_ROWS k of one 16-byte chunk kc per thread (stored at kc ^ tok % 8, the same for
// every k); the tile's groups' scales and zeros: one chunk for each of the first GROUPS_PER_TILE BN / 4
// threads (group gi's BN / 4 chunks after group gi - 1's); with OFFSETS each group's BN offsets after them,
// one chunk for each of the first GROUPS_PER_TILE BN / 8 threads.
#define X_ROWS (2 * WARPS)  // x rows per pass of the CTA's threads (16 chunks each)
#define X_CHUNKS (16 * NT_PAIRS / X_ROWS)
struct Fetch {
    const u32* w;  // tile 0's chunk of row r0
    const u16* x;  // row tok0's chunk kc at K 0
    const u16* sz;  // tile 0's scale or zero chunk (threads past BN / 4: null)
    int w_dst, x_dst, sz_dst;  // byte offsets in a stage
#if OFFSETS
    const u16* off;  // tile 0's offsets chunk (null: none for this thread)
    int off_dst;
#endif
    int x_real;  // chunks k < x_real are rows below M; the rest are zero-filled
};

__device__ __forceinline__ Fetch plan_fetch(const u32* qw, const u16* scales, const u16* zeros,
                                            const u16* offsets, const u16* x, int n, int n0, int stride_x,
                                            int m_left) {
    Fetch f;
    const int tid = threadIdx.x, r0 = tid / (BN / 4), a = tid % (BN / 4);  // r0 < 4: 32 WARPS threads, BN / 4 chunks
    f.w = qw + (long long)r0 * n + n0 + 4 * a;
    f.w_dst = X_STAGE + ((a >> 3) * (W_WARP_BYTES / 16) + w_chunk(r0, a & 7)) * 16;
    const int tok0 = tid >> 4, kc = tid & 15;
    f.x = x + (long long)tok0 * stride_x + 8 * kc;
    f.x_dst = x_stage_offset(tok0, kc);
    f.x_real = m_left > tok0 ? (m_left - tok0 + X_ROWS - 1) / X_ROWS : 0;
    const int gi = tid / (BN / 4), h = tid / (BN / 8) % 2, c = tid % (BN / 8);  // BN / 8 chunks of scales, then zeros
    f.sz = tid < GROUPS_PER_TILE * BN / 4 ? (h ? zeros : scales) + (long long)gi * n + n0 + 8 * c : nullptr;
    f.sz_dst = X_STAGE + W_STAGE + 16 * tid;
#if OFFSETS
    const int go = tid / (BN / 8);  // the offsets' group
    f.off = tid < GROUPS_PER_TILE * BN / 8 ? offsets + (long long)go * n + n0 + 8 * c : nullptr;
    f.off_dst = X_STAGE + W_STAGE + SZ_BYTES + 16 * tid;
#endif
    return f;
}

// Row r0 + 4k's chunk lands (k / 2) * 64 + (k % 2) * 8 chunks after row r0's (see w_chunk).
__device__ __forceinline__ void fetch_weight(char* stage, const Fetch& f, int tile, int n) {
    const u32* w = f.w + (long long)tile * WORD_ROWS * n;
#pragma unroll
    for (int k = 0; k < WORD_ROWS / 4; ++k)
        cp_async16(stage + f.w_dst + ((k >> 1) * 64 + (k & 1) * 8) * 16, w + (long long)k * 4 * n);
    const long long group_row = (long long)(tile * GROUPS_PER_TILE / TILES_PER_GROUP) * n;
    if (f.sz) cp_async16(stage + f.sz_dst, f.sz + group_row);
#if OFFSETS
    if (f.off) cp_async16(stage + f.off_dst, f.off + group_row);
#endif
}

__device__ __forceinline__ void fetch_x(char* stage, const Fetch& f, int tile, int stride_x) {
    const u16* x = f.x + tile * TILE;
    const long long step = (long long)X_ROWS * stride_x;
    if (f.x_real >= X_CHUNKS) {  // a whole token block (the common case): no predicates, no selects
#pragma unroll
        for (int k = 0; k < X_CHUNKS; ++k) cp_async16(stage + f.x_dst + k * X_ROWS * X_ROW_BYTES, x + k * step);
        return;
    }
#pragma unroll
    for (int k = 0; k < X_CHUNKS; ++k) {  // rows past M: zero-filled from row tok0's (a valid) address
        const bool real = k < f.x_real;
        cp_async16(stage + f.x_dst + k * X_ROWS * X_ROW_BYTES, real ? x + k * step : x, real ? 16 : 0);
    }
}
