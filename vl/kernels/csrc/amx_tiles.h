// AMX tile state shared by the kernels that use the tiles (row_kernels.h, attention.cpp): the one-time request for
// the tile state and the tile configuration. Include inside a block compiled only with AMX (`-march=native` on a CPU
// with AMX-TILE and AMX-BF16, Linux).
#pragma once
#include <cstdint>
#include <initializer_list>
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
