// w4a16_gemv.cu's shared-memory ring (RING > 0), included where Tile and tile_into are defined: each warp
// copies its K tiles into RING stages with cp.async (sm_80+), the first RING before the PDL wait.

// One stage: the tile's 16 word rows x 64 columns (chunk c of 16 bytes = 4 columns of row r stored at chunk
// c ^ 2 (r % 4), so the 8 lanes (g, t) of one phase of a 16-byte read, rows 4 rs + t and chunks g (or 8 + g),
// hit 8 distinct bank groups), then its group's 64 scales and 64 zeros.
#define STAGE_BYTES (WORDS_PER_TILE * COLS * 4 + 2 * COLS * 2)

__device__ __forceinline__ int swizzled(int row, int chunk) { return row * 16 + (chunk ^ ((row & 3) << 1)); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const u32 at = static_cast<u32>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// The warp's lanes copy one tile into a stage: 256 weight chunks (8 a lane, two rows per instruction,
// coalesced) and 16 of scales and zeros.
__device__ __forceinline__ void fetch_tile(uint4* stage, const u32* qw, const u16* scales, const u16* zeros,
                                           int tile, int n, int n0, int lane) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = lane + 32 * j, row = i >> 4, chunk = i & 15;
        cp_async16(stage + swizzled(row, chunk), qw + (long long)(tile * WORDS_PER_TILE + row) * n + n0 + 4 * chunk);
    }
    if (lane < 16) {
        const u16* src = lane < 8 ? scales : zeros;
        cp_async16(stage + 256 + lane, src + (long long)(tile / TILES_PER_GROUP) * n + n0 + 8 * (lane & 7));
    }
}

// The stage as load_tile would have left it in registers.
__device__ __forceinline__ void read_tile(Tile& w, const uint4* stage, int g, int t) {
#pragma unroll
    for (int rs = 0; rs < 4; ++rs) {
        w.lo[rs] = stage[swizzled(4 * rs + t, g)];
        w.hi[rs] = stage[swizzled(4 * rs + t, 8 + g)];
    }
    const uint2* sz = reinterpret_cast<const uint2*>(stage + 256);  // 16 uint2 of scales, then 16 of zeros
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        w.s[h] = sz[g + 8 * h];
        w.z[h] = sz[16 + g + 8 * h];
    }
}

// Tiles first + WARPS i of the slice; the caller issued i < RING (one commit group each) before the wait.
// A group per iteration (empty past the end) keeps "all but the newest RING - 1 done" = tile i has landed.
__device__ __forceinline__ void stream_ring(float (*acc)[4], uint4* ring, const u32* qweight, const u16* scales,
                                            const u16* zeros, const uint4* xs, const float* x_sums, int first,
                                            int count, int t_lo, int n, int n0, int lane, int g, int t, int m) {
    for (int i = 0; i < count; ++i) {
        uint4* stage = ring + (i % RING) * (STAGE_BYTES / 16);
        asm volatile("cp.async.wait_group %0;" ::"n"(RING - 1) : "memory");
        __syncwarp();  // the other lanes' copies are visible too
        Tile w;
        read_tile(w, stage, g, t);
        __syncwarp();  // every lane holds the stage: refill it while this tile computes
        if (i + RING < count) fetch_tile(stage, qweight, scales, zeros, first + (i + RING) * WARPS, n, n0, lane);
        cp_async_commit();
        tile_into(acc, w, xs, x_sums, first + i * WARPS - t_lo, g, t, m);
    }
}
