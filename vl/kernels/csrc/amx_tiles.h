// AMX tile state shared by the kernels that use the tiles (row_kernels.h, attention.cpp): the one-time request for
// the tile state and the tile configuration. Include inside a block compiled only with AMX (`-march=native` on a CPU
// with AMX-TILE and AMX-BF16, Linux).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <new>
#include <vector>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// Linux gives a process the tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM, once for all its threads);
// where it is refused the callers run their loops without tiles.
static bool amx_ready() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

struct AmxConfig {  // the LDTILECFG operand: palette 1, then bytes per row and rows of tiles 0-15
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Loads the tile configuration of one kernel (per thread): tiles 0.. of 16 rows each, colsb[t] bytes per row.
static inline void amx_configure(std::initializer_list<int> colsb) {
  AmxConfig cfg{};
  cfg.palette = 1;
  int t = 0;
  for (int c : colsb) {
    cfg.rows[t] = 16;
    cfg.colsb[t++] = (uint16_t)c;
  }
  _tile_loadconfig(&cfg);
}

// A tile's rows are 64 bytes: rows that straddle two cache lines made a 1 KiB tile load ~6x slower (15.4 against
// 2.4 ns, L1-resident, one core of an Intel Xeon with AMX). std::vector's memory is only 16-byte aligned (glibc's
// malloc), so every buffer that tiles load from or store to is a `tile_vector`: 64-byte aligned.
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const Aligned64<U>&) const { return true; }
  template <class U>
  bool operator!=(const Aligned64<U>&) const { return false; }
};
template <class T>
using tile_vector = std::vector<T, Aligned64<T>>;
