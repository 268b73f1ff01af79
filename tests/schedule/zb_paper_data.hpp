// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Zero Bubble paper's evaluated configurations, as data (Qi et al., "Zero Bubble Pipeline
// Parallelism", arXiv:2401.10241v1, 30 Nov 2023; ICLR 2024):
//  - model shapes (heads a, hidden h, sequence s): Table 3 (§5.1);
//  - profiled T_F, T_B, T_W, T_comm in ms: Table 9 (Appendix D);
//  - bubble rates of 1F1B, ZB-H1, ZB-H2, ZB-1p, ZB-2p: Table 5 (§5.3);
//  - ZB-V bubble rates: Table 8 (§6.2). The paper does not publish the profiled times of its
//    ZB-V runs (p = 16/24/32 with other microbatch sizes), so Table 8 rows carry no costs.
// M_W/M_B = 32h / (34h + 5as) per transformer layer (Table 1, §2.3).
#include <array>

#include <loom/schedule/shape.hpp>

namespace loom_paper {

struct zb_config {
  const char* model;
  int heads, hidden, seq;
  int p, m;
  double f, b, w, comm;                         // Table 9
  double r_1f1b, r_zbh1, r_zbh2, r_zb1p, r_zb2p;  // Table 5
  constexpr double mem_w_ratio() const {
    return 32.0 * hidden / (34.0 * hidden + 5.0 * heads * static_cast<double>(seq));
  }
  //! Table 9's profiled costs of this run, with its M_W/M_B.
  constexpr loom::costs cost() const { return {.f = f, .b = b, .w = w, .c = comm, .mem_w_ratio = mem_w_ratio()}; }
};

inline constexpr std::array<zb_config, 12> table5 = {{
    {"1.5B", 24, 2304, 1024, 8, 24, 18.522, 18.086, 9.337, 0.601, 0.2431, 0.1585, 0.1083, 0.1585, 0.0433},
    {"1.5B", 24, 2304, 1024, 8, 32, 18.513, 18.086, 9.331, 0.626, 0.1985, 0.1242, 0.0837, 0.1242, 0.0039},
    {"1.5B", 24, 2304, 1024, 8, 64, 18.546, 18.097, 9.321, 0.762, 0.1240, 0.0674, 0.0444, 0.0674, 0.0026},
    {"6.2B", 32, 4096, 1024, 8, 24, 29.718, 29.444, 19.927, 0.527, 0.2347, 0.1323, 0.0698, 0.1323, 0.0029},
    {"6.2B", 32, 4096, 1024, 8, 32, 29.802, 29.428, 19.530, 0.577, 0.1898, 0.1045, 0.0559, 0.1045, 0.0022},
    {"6.2B", 32, 4096, 1024, 8, 64, 29.935, 29.621, 19.388, 0.535, 0.1091, 0.0554, 0.0294, 0.0554, 0.0010},
    {"14.6B", 40, 5120, 1024, 16, 48, 11.347, 11.248, 8.132, 0.377, 0.2552, 0.1397, 0.0672, 0.1397, 0.0066},
    {"14.6B", 40, 5120, 1024, 16, 64, 11.307, 11.254, 8.101, 0.379, 0.2082, 0.1088, 0.0516, 0.1088, 0.0054},
    {"14.6B", 40, 5120, 1024, 16, 128, 11.325, 11.308, 8.109, 0.378, 0.1251, 0.0576, 0.0266, 0.0576, 0.0028},
    {"28.3B", 48, 6144, 1024, 32, 96, 10.419, 10.207, 7.715, 0.408, 0.2646, 0.1421, 0.0641, 0.1421, 0.0038},
    {"28.3B", 48, 6144, 1024, 32, 128, 10.408, 10.204, 7.703, 0.408, 0.2168, 0.1106, 0.0490, 0.1106, 0.0029},
    {"28.3B", 48, 6144, 1024, 32, 256, 10.402, 10.248, 7.698, 0.460, 0.1352, 0.0594, 0.0257, 0.0594, 0.0018},
}};

struct zbv_row {
  const char* model;
  int p, m;
  double r_1f1b, r_zbh1, r_zbh2, r_zbv;  // Table 8
};

inline constexpr std::array<zbv_row, 9> table8 = {{
    {"6.2B", 16, 48, 0.2668, 0.1536, 0.0823, 0.0697},   {"6.2B", 16, 64, 0.2206, 0.1198, 0.0630, 0.0533},
    {"6.2B", 16, 128, 0.1390, 0.0637, 0.0325, 0.0274},  {"14.6B", 24, 72, 0.2699, 0.1439, 0.0628, 0.0638},
    {"14.6B", 24, 96, 0.2229, 0.1121, 0.0480, 0.0483},  {"14.6B", 24, 192, 0.1403, 0.0595, 0.0247, 0.0250},
    {"28.3B", 32, 96, 0.2676, 0.1429, 0.0629, 0.0593},  {"28.3B", 32, 128, 0.2204, 0.1111, 0.0478, 0.0451},
    {"28.3B", 32, 256, 0.1362, 0.0626, 0.0251, 0.0236},
}};

//! `x` rounded to the paper's 4 decimals (its tables print 4).
inline double round4(double x) { return static_cast<double>(static_cast<long long>(x * 10000 + 0.5)) / 10000; }

}  // namespace loom_paper
