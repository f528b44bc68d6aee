// Where an entry's code lives in a list of the GPU mirror. Row-major: entry
// r's m bytes at r * m. Interleaved (ListStore::interleaved, the RaBitQ
// mirror's rows, m a multiple of 4): blocks of kInterleaveRows entries,
// word w of entry r at word ((r / 32) * W + w) * 32 + r % 32 (W = m / 4), so
// that the 32 threads of a warp scoring 32 consecutive entries load each
// word of their rows in one 128-byte transaction (row-major 768-d rows
// touched a sector per thread and word, and the list scan was bound by L2).
// A list's capacity is a whole number of blocks; its first size entries
// occupy the first ceil(size / 32) blocks whatever the capacity.
#pragma once

#include <cstdint>

namespace gpuivfpq::gpu {

constexpr int kInterleaveRows = 32;

// The word index of entry r's word w (W words an entry).
__host__ __device__ __forceinline__ int64_t interleaved_word(int64_t r, int w, int words)
{
    return ((r / kInterleaveRows) * words + w) * kInterleaveRows + r % kInterleaveRows;
}

// Entry r's word 0 in an interleaved list; its word w is at [w * kInterleaveRows].
__host__ __device__ __forceinline__ const uint32_t* interleaved_row(const uint8_t* list, int64_t r, int words)
{
    return reinterpret_cast<const uint32_t*>(list) + interleaved_word(r, 0, words);
}

// Entry r's word 0 in a list of m-byte entries (m a multiple of 4),
// interleaved or not; its word w is at [w * list_word_stride(interleaved)].
__host__ __device__ __forceinline__ const uint32_t* list_row(const uint8_t* list, int64_t r, int m, bool interleaved)
{
    return interleaved ? interleaved_row(list, r, m / 4) : reinterpret_cast<const uint32_t*>(list + r * m);
}

__host__ __device__ __forceinline__ int list_word_stride(bool interleaved) { return interleaved ? kInterleaveRows : 1; }

}  // namespace gpuivfpq::gpu
