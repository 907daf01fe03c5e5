// ggml's CPU_REPACK layout of Q4_K on AVX2 CPUs (block_q4_Kx8), read by the decode mat-vec
// (kernels/matvec_q4_k_x8.inc) and the int8 GEMM (kernels/gemm_avx2_rows.inc).
//
// One block_q4_Kx8 (1152 bytes) holds one 256-weight super-block of each of 8 rows:
//   d[8], dmin[8] (fp16), scales[96] (6-bit scales and mins of the 8 x 8 sub-blocks of 32, packed
//   12 bytes per sub-block: bytes 0-3 / 4-7 the scales / mins of rows 0-3 (low 6 bits; the top 2
//   bits are bits 4-5 of rows 4-7's), bytes 8-11 the low nibbles of rows 4-7's scale | min << 4),
//   qs[1024]: 16 chunks of 64 bytes, chunk c = 8 bytes of each row (row r at 8r), bytes 8c..8c+7 of
//   that row's plain Q4_K quants: low nibbles are weights 64j + l (sub-block 2j), high nibbles weights
//   64j + 32 + l (sub-block 2j + 1), j = c / 4, l = 8 (c % 4) + 0..7.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fun_asr {

constexpr size_t kQ4KX8Bytes = 1152;

// The 6-bit scales and mins of every (sub-block s, row r) of one block.
inline void q4_k_x8_scales(const uint8_t * blk, uint8_t sc[8][8], uint8_t mn[8][8]) {
    for (int s = 0; s < 8; ++s) {
        const uint8_t * p = blk + 32 + (s < 4 ? 12 * s : 48 + 12 * (s - 4));
        uint32_t a, bb, c;
        std::memcpy(&a, p, 4);
        std::memcpy(&bb, p + 4, 4);
        std::memcpy(&c, p + 8, 4);
        const uint32_t s_lo = a & 0x3F3F3F3Fu, s_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
        const uint32_t m_lo = bb & 0x3F3F3F3Fu, m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((bb >> 2) & 0x30303030u);
        // one 8-byte store per row of sc / mn: the kernels read them back as 8-byte loads, which a
        // store-to-load forward serves only from a single store (two 4-byte stores stall the load)
        const uint64_t s8 = s_lo | static_cast<uint64_t>(s_hi) << 32, m8 = m_lo | static_cast<uint64_t>(m_hi) << 32;
        std::memcpy(&sc[s][0], &s8, 8);
        std::memcpy(&mn[s][0], &m8, 8);
    }
}

}  // namespace fun_asr
