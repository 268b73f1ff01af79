// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Parallelism dimensions and the mesh that composes them.
//!
//! A dimension is one way of dividing the work of a training step over ranks:
//! - `loom::dp<N>` data parallel: `N` replicas of the model, each on its share of the batch;
//! - `loom::tp<N>` tensor parallel: each layer's weights split over `N` ranks (Megatron-LM), or
//!   over a grid: `tp<4, tp_kind::d2>` (2D, a 2 x 2 grid), `tp<8, tp_kind::d2_5, 2>` (2.5D),
//!   `tp<8, tp_kind::d3>` (3D), whose row, column and depth groups `mesh_comm::grid` gives;
//! - `loom::pp<N>` pipeline parallel: the layers cut into stages run by a schedule;
//! - `loom::sp<N>` sequence parallel: the sequence split over `N` ranks (Megatron-SP, Ulysses,
//!   ring attention, USP; see `loom/exec/sequence_parallel.hpp`);
//! - `loom::ep<N>` expert parallel: the experts of every mixture-of-experts layer over `N` ranks
//!   (see `loom/exec/moe.hpp`). Ranks that differ in `ep` hold different experts *and* different
//!   tokens, so the dense (non-expert) parameters are data-parallel over `dp x ep` and the expert
//!   parameters over `dp` alone: the expert-data layout of Megatron-core and DeepSpeed-MoE, as a
//!   mesh axis (`loom::data_parallel` reduces each `grad_range` over its group accordingly).
//!
//! `N` is a constant or `loom::dynamic` (given at run time); both use one code path, as CuTe's
//! `Int<4>` and `int` or mdspan's static and dynamic extents do. A dimension of 0 ranks is
//! refused: at compile time for a constant, with a `config_error` for a run-time size.
//!
//! `loom::mesh<D...>` lists each dimension at most once. Its order fixes the rank layout:
//! row-major, the *last* dimension innermost, so ranks that differ only in the last coordinate
//! are adjacent (`mesh<pp<2>, dp<2>, tp<2>>`: ranks 0 and 1 are a tensor-parallel pair, as
//! tensor parallelism wants NVLink neighbours). A dimension the mesh does not list has size 1.
//! Rank <-> coordinates, the sub-group of any set of dimensions (colour and key for `split`)
//! and the mesh's size are `constexpr`. Binding a mesh to a communicator and creating the
//! sub-group communicators is `loom::mesh_comm` (`loom/mesh/mesh_comm.hpp`).

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "loom/schedule/error.hpp"

namespace loom {

//! The size of a dimension known only at run time (as `std::dynamic_extent`).
inline constexpr int dynamic = -1;

//! The five parallelism dimensions (`ep` last, so the bits of the first four are those they had
//! before it came).
enum class dim : unsigned char { dp, tp, pp, sp, ep };

//! Number of dimensions.
inline constexpr std::size_t dim_count = 5;

//! Every dimension, in the order used when naming sets of them.
inline constexpr std::array<dim, dim_count> all_dims{dim::dp, dim::ep, dim::tp, dim::pp, dim::sp};

//! Name of a dimension ("dp", "tp", "pp", "sp", "ep").
constexpr std::string_view to_string(dim d) noexcept {
  switch (d) {
    case dim::dp: return "dp";
    case dim::tp: return "tp";
    case dim::pp: return "pp";
    case dim::sp: return "sp";
    case dim::ep: return "ep";
  }
  return "?";
}

//! A set of dimensions (a bit mask), e.g. `dim_set{dim::dp} | dim::sp` for the group over which
//! ZeRO shards when the sequence is split too.
struct dim_set {
  unsigned bits = 0;  //!< bit `i` set when `dim(i)` is in the set

  constexpr dim_set() = default;
  //! The set holding `d` alone.
  constexpr dim_set(dim d) : bits(1u << static_cast<unsigned>(d)) {}  // NOLINT: implicit on purpose
  //! Whether `d` is in the set.
  constexpr bool contains(dim d) const { return (bits >> static_cast<unsigned>(d)) & 1u; }
  //! Whether the set is empty.
  constexpr bool empty() const { return bits == 0; }
  //! The union.
  friend constexpr dim_set operator|(dim_set a, dim_set b) {
    dim_set s;
    s.bits = a.bits | b.bits;
    return s;
  }
  friend constexpr bool operator==(dim_set, dim_set) = default;
};

//! `dim_set{a} | b`.
constexpr dim_set operator|(dim a, dim b) { return dim_set{a} | dim_set{b}; }

//! Name of a set of dimensions: "dp", "dp x sp", or "(none)".
constexpr text to_string(dim_set s) {
  text out;
  for (dim d : all_dims)
    if (s.contains(d)) {
      if (!out.empty()) out += " x ";
      out += to_string(d);
    }
  if (out.empty()) out = "(none)";
  return out;
}

namespace detail {

//! Fails to compile when instantiated with a non-empty message, which the diagnostic shows
//! ("mesh_rule_violated<fixed_message{"..."}>", and whole, under GCC and clang, in
//! 'message_text<exact_message<N>{"..."}>': clang elides a fixed_message's text).
template <fixed_message Rule>
struct mesh_rule_violated {
  static_assert(no_message(message_text<exact_of<Rule>>{}),
                "loom: this mesh breaks a rule; the rule is the text in "
                "'message_text<exact_message<N>{\"...\"}>' above");
};

//! The rule a run-time size `n` of dimension `d` breaks, or "".
constexpr text dimension_rule(dim d, int n) {
  if (n >= 1) return {};
  return "mesh dimension " + text(to_string(d)) + " has " + to_text(n) +
         " ranks; every dimension needs at least 1 rank";
}

}  // namespace detail

//! One dimension `D` of static size `N` (or `loom::dynamic`). Prefer the aliases `dp<N>`,
//! `tp<N>`, `pp<N>`, `sp<N>`, `ep<N>`. A static dimension is default-constructible; a dynamic one is
//! constructed from its size (a static one may be too, with the same size). Sizes below 1 are
//! refused: a static one does not compile, a run-time one throws `config_error`.
template <dim D, int N>
class dimension {
  static_assert(N == dynamic || N >= 1,
                "loom: a mesh dimension needs at least 1 rank (dp<0>, tp<0>, pp<0>, sp<0>, ep<0> and negative "
                "sizes other than loom::dynamic are refused)");

 public:
  static constexpr dim kind = D;                //!< which dimension
  static constexpr int static_size = N;         //!< the size, or `loom::dynamic`
  static constexpr bool is_static = N != dynamic;  //!< whether the size is a constant

  //! A static dimension.
  constexpr dimension()
    requires(is_static)
  = default;
  //! A dimension of `n` ranks: `n` must be at least 1, and equal `N` when static.
  constexpr explicit dimension(int n) : size_(n) {
    if (text rule = detail::dimension_rule(D, n); !rule.empty()) throw config_error(rule);
    if (is_static && n != N)
      throw config_error("mesh dimension " + text(to_string(D)) + "<" + detail::to_text(N) +
                         "> was given the size " + detail::to_text(n));
  }
  //! Number of ranks along the dimension.
  constexpr int size() const { return size_; }

 private:
  int size_ = is_static ? N : 1;
};

//! The shape of the tensor-parallel group (issue 25):
//! - `d1`: Megatron-LM's 1D split (Shoeybi et al. 2019), the whole group one line;
//! - `d2`: a `q x q` grid (Optimus, Xu et al. 2021: SUMMA over rows and columns);
//! - `d2_5`: `depth` layers of a `q x q` grid (Tesseract, Wang et al., ICPP 2022);
//! - `d3`: a `q x q x q` cube (Bian et al. 2021);
//! - `dynamic`: as a template argument only, the kind is given at run time.
//! Spelled "1d", "2d", "2.5d", "3d" on command lines and in messages.
enum class tp_kind : unsigned char { d1, d2, d2_5, d3, dynamic };

//! The spelling of a kind ("1d", "2d", "2.5d", "3d"; "dynamic").
constexpr std::string_view to_string(tp_kind k) noexcept {
  switch (k) {
    case tp_kind::d1: return "1d";
    case tp_kind::d2: return "2d";
    case tp_kind::d2_5: return "2.5d";
    case tp_kind::d3: return "3d";
    case tp_kind::dynamic: return "dynamic";
  }
  return "?";
}

//! The kind spelled `s` ("1d", "2d", "2.5d", "3d"), or false.
constexpr bool parse_tp_kind(std::string_view s, tp_kind& out) noexcept {
  for (tp_kind k : {tp_kind::d1, tp_kind::d2, tp_kind::d2_5, tp_kind::d3})
    if (s == to_string(k)) {
      out = k;
      return true;
    }
  return false;
}

//! The sub-groups of a tensor-parallel grid. A grid's member `t` (its index in the tp group) sits
//! at layer `t / q^2`, row `(t / q) % q` and column `t % q` (the column innermost, so a row is `q`
//! adjacent ranks): `row` groups the `q` ranks of one row of one layer (ordered by column),
//! `column` the `q` ranks of one column of one layer (ordered by row), `depth` the ranks at one
//! (row, column) position of every layer (ordered by layer: `depth` ranks for 2.5D, `q` for 3D,
//! one for 2D). 3D's input, weight and output groups (Bian et al.) are these three, assigned
//! per layer by the linear layer that uses them.
enum class grid_group : unsigned char { row, column, depth };

//! Name of a grid group ("row", "column", "depth").
constexpr std::string_view to_string(grid_group g) noexcept {
  switch (g) {
    case grid_group::row: return "row";
    case grid_group::column: return "column";
    case grid_group::depth: return "depth";
  }
  return "?";
}

//! The shape of a tensor-parallel group of `ranks` ranks: its kind, the side `q` of its grid and
//! its number of layers `depth` (`ranks = q * q * depth`; 1D: `q = depth = 1`, no grid). Made
//! by `make_tp_grid`, which checks the rules.
struct tp_grid {
  tp_kind kind = tp_kind::d1;  //!< the kind (never `dynamic`)
  int ranks = 1;               //!< ranks in the tensor-parallel group
  int q = 1;                   //!< the side of the grid (rows = columns = q; 1 for 1D)
  int depth = 1;               //!< layers of the grid (`d` for 2.5D, `q` for 3D, else 1)

  //! Whether the group is a grid (every kind but 1D).
  constexpr bool is_grid() const { return kind != tp_kind::d1; }
  //! The layer of member `t`.
  constexpr int layer(int t) const { return t / (q * q); }
  //! The row of member `t`.
  constexpr int row(int t) const { return (t / q) % q; }
  //! The column of member `t`.
  constexpr int column(int t) const { return t % q; }
  //! The member at (`layer`, `row`, `column`).
  constexpr int member(int layer_, int row_, int column_) const { return (layer_ * q + row_) * q + column_; }
  //! Number of ranks of each group of `g`.
  constexpr int size(grid_group g) const { return g == grid_group::depth ? depth : q; }
  //! Which group of `g` holds member `t` (the `color` for `split`).
  constexpr int group_id(grid_group g, int t) const {
    switch (g) {
      case grid_group::row: return t / q;
      case grid_group::column: return layer(t) * q + column(t);
      case grid_group::depth: return t % (q * q);
    }
    return 0;
  }
  //! Member `t`'s index in its group of `g` (the `key` for `split`).
  constexpr int group_index(grid_group g, int t) const {
    switch (g) {
      case grid_group::row: return column(t);
      case grid_group::column: return row(t);
      case grid_group::depth: return layer(t);
    }
    return 0;
  }
  //! The member with index `index` in the group of `g` that holds member `t`.
  constexpr int group_member(grid_group g, int t, int index) const {
    switch (g) {
      case grid_group::row: return member(layer(t), row(t), index);
      case grid_group::column: return member(layer(t), index, column(t));
      case grid_group::depth: return member(index, row(t), column(t));
    }
    return t;
  }
  //! "1d", "2d 2x2", "2.5d 2x2x2" (q x q x depth), "3d 2x2x2".
  constexpr text describe() const {
    text out(to_string(kind));
    if (!is_grid()) return out;
    out += " " + detail::to_text(q) + "x" + detail::to_text(q);
    if (kind != tp_kind::d2) out += "x" + detail::to_text(depth);
    return out;
  }
  friend constexpr bool operator==(const tp_grid&, const tp_grid&) = default;
};

namespace detail {

//! The integer `r` with `r^p == n` (p = 2 or 3), or 0.
constexpr int exact_root(int n, int p) {
  for (int r = 1; r <= n; ++r) {
    long long v = 1;
    for (int i = 0; i < p; ++i) v *= r;
    if (v == n) return r;
    if (v > n) break;
  }
  return 0;
}

//! The rule a tensor-parallel group of `n` ranks of kind `k` with `depth` breaks, or "" (`depth`
//! is 2.5D's number of layers; 0 for the other kinds, which imply theirs).
constexpr text tp_grid_rule(tp_kind k, int n, int depth) {
  const text name = "tensor parallel " + text(to_string(k));
  if (k == tp_kind::dynamic) return "tensor parallel: the kind must be 1d, 2d, 2.5d or 3d";
  if (n < 1) return dimension_rule(dim::tp, n);
  if (k != tp_kind::d2_5 && depth != 0)
    return name + " takes no depth (only 2.5d does); it was given " + to_text(depth);
  switch (k) {
    case tp_kind::d2:
      if (exact_root(n, 2) == 0) return name + " needs q x q ranks; tp " + to_text(n) + " is not a square";
      break;
    case tp_kind::d3:
      if (exact_root(n, 3) == 0) return name + " needs q x q x q ranks; tp " + to_text(n) + " is not a cube";
      break;
    case tp_kind::d2_5:
      if (depth < 1) return name + " needs a depth of at least 1; it was given " + to_text(depth);
      if (n % depth != 0 || exact_root(n / depth, 2) == 0)
        return name + " needs q x q x depth ranks; tp " + to_text(n) + " is not q x q x " + to_text(depth) + " for any q";
      break;
    default: break;
  }
  return {};
}

//! The grid of a valid (kind, ranks, depth); a 1D group for an invalid one (checked elsewhere).
constexpr tp_grid grid_of(tp_kind k, int n, int depth) {
  if (!tp_grid_rule(k, n, depth).empty()) return tp_grid{tp_kind::d1, n < 1 ? 1 : n, 1, 1};
  switch (k) {
    case tp_kind::d2: return {k, n, exact_root(n, 2), 1};
    case tp_kind::d2_5: return {k, n, exact_root(n / depth, 2), depth};
    case tp_kind::d3: {
      const int q = exact_root(n, 3);
      return {k, n, q, q};
    }
    default: return {tp_kind::d1, n, 1, 1};
  }
}

template <int N, tp_kind K, int Depth>
constexpr fixed_message static_grid_message() {
  if constexpr (N != dynamic && K != tp_kind::dynamic && (K != tp_kind::d2_5 || Depth != dynamic))
    return fixed_message{tp_grid_rule(K, N, Depth == dynamic ? 0 : Depth)};
  else return fixed_message{};
}

}  // namespace detail

//! The grid of a tensor-parallel group of `ranks` ranks of kind `kind` (`depth`: 2.5D's layers;
//! 0 for the other kinds); throws `config_error` with the rule it breaks (tp not a square for
//! 2D, not `q x q x depth` for 2.5D, not a cube for 3D, a depth for another kind).
constexpr tp_grid make_tp_grid(tp_kind kind, int ranks, int depth = 0) {
  if (text rule = detail::tp_grid_rule(kind, ranks, depth); !rule.empty()) throw config_error(rule);
  return detail::grid_of(kind, ranks, depth);
}

//! The tensor-parallel dimension: `N` ranks (or `loom::dynamic`) shaped as kind `K` (or
//! `tp_kind::dynamic`), with 2.5D's `Depth` layers (or `loom::dynamic`; the other kinds imply
//! theirs). Prefer the alias `tp<N, K, Depth>`: `tp<4>` is Megatron's 1D split over 4 ranks,
//! `tp<4, tp_kind::d2>` a 2 x 2 grid, `tp<8, tp_kind::d2_5, 2>` two layers of 2 x 2, and
//! `tp<dynamic, tp_kind::dynamic>{n, kind, depth}` all three at run time. A static shape that
//! breaks a rule of its kind does not compile (the diagnostic shows the rule); a run-time one
//! throws `config_error` with it. The grid's sub-groups come from `loom::mesh_comm::grid`.
template <int N = dynamic, tp_kind K = tp_kind::d1, int Depth = dynamic>
class tensor_dimension {
  static_assert(N == dynamic || N >= 1,
                "loom: a mesh dimension needs at least 1 rank (dp<0>, tp<0>, pp<0>, sp<0>, ep<0> and negative "
                "sizes other than loom::dynamic are refused)");
  static_assert(Depth == dynamic || (K == tp_kind::d2_5 && Depth >= 1) || K == tp_kind::dynamic,
                "loom: only tensor parallel 2.5d takes a depth, of at least 1 layer");

  static constexpr bool grid_static = K != tp_kind::dynamic && (K != tp_kind::d2_5 || Depth != dynamic);
  static constexpr int given_depth(int depth) { return Depth != dynamic && depth == 0 ? Depth : depth; }

 public:
  static constexpr dim kind = dim::tp;                        //!< which dimension
  static constexpr int static_size = N;                       //!< the size, or `loom::dynamic`
  static constexpr tp_kind static_kind = K;                   //!< the kind, or `tp_kind::dynamic`
  static constexpr int static_depth = Depth;                  //!< 2.5D's depth, or `loom::dynamic`
  static constexpr bool is_static = N != dynamic && grid_static;  //!< whether size and shape are constants

  //! A static dimension.
  constexpr tensor_dimension()
    requires(is_static)
  = default;
  //! A dimension of `n` ranks of the static kind (`tp_kind::dynamic`: 1D) and depth.
  constexpr explicit tensor_dimension(int n)
      : tensor_dimension(n, K == tp_kind::dynamic ? tp_kind::d1 : K, Depth == dynamic ? 0 : Depth) {}
  //! A dimension of `n` ranks of kind `k` with 2.5D's `depth` layers (0 for the other kinds);
  //! `n`, `k` and `depth` must equal the static ones where the type fixes them.
  constexpr tensor_dimension(int n, tp_kind k, int depth = 0) {
    if (text rule = detail::dimension_rule(dim::tp, n); !rule.empty()) throw config_error(rule);
    if (N != dynamic && n != N)
      throw config_error("mesh dimension tp<" + detail::to_text(N) + "> was given the size " + detail::to_text(n));
    if (K != tp_kind::dynamic && k != K)
      throw config_error("mesh dimension tp of kind " + text(to_string(K)) + " was given the kind " + text(to_string(k)));
    if (Depth != dynamic && depth != 0 && depth != Depth)
      throw config_error("mesh dimension tp of depth " + detail::to_text(Depth) + " was given the depth " +
                         detail::to_text(depth));
    grid_ = make_tp_grid(k, n, given_depth(depth));
  }
  //! Number of ranks along the dimension.
  constexpr int size() const { return grid_.ranks; }
  //! The shape of the group.
  constexpr const tp_grid& grid() const { return grid_; }

 private:
  [[no_unique_address]] detail::mesh_rule_violated<detail::static_grid_message<N, K, Depth>()> check_{};
  tp_grid grid_ = is_static ? detail::grid_of(K, N, Depth == dynamic ? 0 : Depth) : tp_grid{};
};

//! Data parallel: `N` model replicas.
template <int N = dynamic>
using dp = dimension<dim::dp, N>;
//! Tensor parallel: each layer's weights over `N` ranks, as a line (1D, Megatron-LM; the
//! default) or a grid of kind `K` (see `tensor_dimension`).
template <int N = dynamic, tp_kind K = tp_kind::d1, int Depth = dynamic>
using tp = tensor_dimension<N, K, Depth>;
//! Pipeline parallel: `N` pipeline ranks.
template <int N = dynamic>
using pp = dimension<dim::pp, N>;
//! Sequence parallel: the sequence over `N` ranks.
template <int N = dynamic>
using sp = dimension<dim::sp, N>;
//! Expert parallel: the experts of each mixture-of-experts layer over `N` ranks, which also hold
//! different tokens (see the file comment).
template <int N = dynamic>
using ep = dimension<dim::ep, N>;

//! True for the `dimension` types.
template <class T>
inline constexpr bool is_dimension_v = false;
template <dim D, int N>
inline constexpr bool is_dimension_v<dimension<D, N>> = true;
template <int N, tp_kind K, int Depth>
inline constexpr bool is_dimension_v<tensor_dimension<N, K, Depth>> = true;

//! A mesh dimension type.
template <class T>
concept mesh_dimension = is_dimension_v<T>;

//! Coordinates of a rank along every dimension (indexed by `dim`; 0 for absent ones).
using mesh_coords = std::array<int, dim_count>;

//! The dimensions `Dims...` composed over `size()` ranks, the last one innermost (see the file
//! comment). Constructed from one object per dimension (`mesh<dp<>, tp<2>> m{dp<>{4}, tp<2>{}}`)
//! or default-constructed when every dimension is static.
template <mesh_dimension... Dims>
class mesh {
  static constexpr std::array<dim, sizeof...(Dims)> order_{Dims::kind...};

  static constexpr bool unique_dims() {
    for (std::size_t i = 0; i < order_.size(); ++i)
      for (std::size_t j = i + 1; j < order_.size(); ++j)
        if (order_[i] == order_[j]) return false;
    return true;
  }
  static_assert(unique_dims(), "loom: a mesh lists each dimension (dp, tp, pp, sp, ep) at most once");

 public:
  //! Number of dimensions listed.
  static constexpr std::size_t dims_listed = sizeof...(Dims);
  //! True when every dimension's size is a constant.
  static constexpr bool is_static = (Dims::is_static && ...);
  //! The product of the static sizes, or `loom::dynamic`.
  static constexpr int static_size = is_static ? (1 * ... * (Dims::is_static ? Dims::static_size : 1)) : dynamic;

  //! A mesh of static dimensions.
  constexpr mesh()
    requires(is_static)
  {
    (take_grid(Dims{}), ...);
    fill();
  }
  //! A mesh from its dimensions, in the order of the type.
  constexpr explicit mesh(Dims... d) : dims_{d.size()...} {
    (take_grid(d), ...);
    fill();
  }

  //! The listed dimensions, outermost first.
  static constexpr std::span<const dim> order() { return order_; }
  //! Whether `d` is listed.
  static constexpr bool has(dim d) {
    for (dim x : order_)
      if (x == d) return true;
    return false;
  }
  //! Number of ranks of the mesh (the product of the sizes).
  constexpr int size() const {
    int n = 1;
    for (int s : dims_) n *= s;
    return n;
  }
  //! Size of dimension `d` (1 when it is not listed).
  constexpr int size(dim d) const { return sizes_[static_cast<std::size_t>(d)]; }
  //! Number of ranks of the sub-group spanned by the dimensions of `s`.
  constexpr int size(dim_set s) const {
    int n = 1;
    for (dim d : all_dims)
      if (s.contains(d)) n *= size(d);
    return n;
  }

  //! The shape of the tensor-parallel group: 1D over `size(dim::tp)` ranks unless the mesh's
  //! `tp` dimension is a grid.
  constexpr const tp_grid& grid() const { return grid_; }

  //! Coordinates of `rank` (row-major over the listed dimensions, the last innermost).
  constexpr mesh_coords coords(int rank) const {
    check_rank(rank);
    mesh_coords c{};
    for (std::size_t i = order_.size(); i-- > 0;) {
      c[static_cast<std::size_t>(order_[i])] = rank % dims_[i];
      rank /= dims_[i];
    }
    return c;
  }
  //! Coordinate of `rank` along `d` (0 when `d` is not listed).
  constexpr int coord(dim d, int rank) const { return coords(rank)[static_cast<std::size_t>(d)]; }
  //! The rank at coordinates `c` (entries of absent dimensions must be 0).
  constexpr int rank_of(const mesh_coords& c) const {
    int r = 0;
    for (dim d : all_dims) {
      int v = c[static_cast<std::size_t>(d)];
      if (v < 0 || v >= size(d))
        throw config_error("mesh coordinate " + text(to_string(d)) + " = " + detail::to_text(v) +
                           " is outside 0.." + detail::to_text(size(d) - 1));
    }
    for (std::size_t i = 0; i < order_.size(); ++i) r = r * dims_[i] + c[static_cast<std::size_t>(order_[i])];
    return r;
  }

  //! Index of `rank` inside the sub-group spanned by `s` (row-major over the dimensions of `s`
  //! in mesh order): the `key` for `split`, and the rank's index in that group.
  constexpr int group_index(dim_set s, int rank) const { return linear(s, rank, true); }
  //! Which sub-group spanned by `s` holds `rank` (row-major over the other dimensions): the
  //! `color` for `split`.
  constexpr int group_id(dim_set s, int rank) const { return linear(s, rank, false); }
  //! The rank of the member `index` of the sub-group spanned by `s` that holds `rank`.
  constexpr int group_member(dim_set s, int rank, int index) const {
    mesh_coords c = coords(rank);
    for (std::size_t i = order_.size(); i-- > 0;) {
      dim d = order_[i];
      if (!s.contains(d)) continue;
      c[static_cast<std::size_t>(d)] = index % dims_[i];
      index /= dims_[i];
    }
    return rank_of(c);
  }

  //! "pp2 x dp2 x tp2": the dimensions in mesh order with their sizes.
  constexpr text describe() const {
    text out;
    for (std::size_t i = 0; i < order_.size(); ++i) {
      if (i) out += " x ";
      out += to_string(order_[i]);
      out += detail::to_text(dims_[i]);
      if (order_[i] == dim::tp && grid_.is_grid()) out += "[" + grid_.describe() + "]";
    }
    if (out.empty()) out = "(one rank)";
    return out;
  }

  //! The rule broken when this mesh runs on a world of `world_size` ranks, or "".
  constexpr text world_rule(int world_size) const {
    if (size() == world_size) return {};
    return "mesh " + describe() + " has " + detail::to_text(size()) + " ranks but the world has " +
           detail::to_text(world_size);
  }
  //! Throws `config_error` unless the mesh has exactly `world_size` ranks. Every rank can call it
  //! before any communication: it reads nothing but the two sizes.
  constexpr void check_world(int world_size) const {
    if (text rule = world_rule(world_size); !rule.empty()) throw config_error(rule);
  }

 private:
  constexpr void fill() {
    for (auto& s : sizes_) s = 1;
    for (std::size_t i = 0; i < order_.size(); ++i) sizes_[static_cast<std::size_t>(order_[i])] = dims_[i];
    if (!grid_.is_grid()) grid_ = tp_grid{tp_kind::d1, size(dim::tp), 1, 1};
  }
  template <class D>
  constexpr void take_grid(const D& d) {
    if constexpr (requires { d.grid(); }) grid_ = d.grid();
  }
  constexpr void check_rank(int rank) const {
    if (rank < 0 || rank >= size())
      throw config_error("rank " + detail::to_text(rank) + " is outside the mesh " + describe() + " (ranks 0.." +
                         detail::to_text(size() - 1) + ")");
  }
  constexpr int linear(dim_set s, int rank, bool inside) const {
    const mesh_coords c = coords(rank);
    int r = 0;
    for (std::size_t i = 0; i < order_.size(); ++i)
      if (s.contains(order_[i]) == inside) r = r * dims_[i] + c[static_cast<std::size_t>(order_[i])];
    return r;
  }

  std::array<int, sizeof...(Dims)> dims_{(Dims::is_static ? Dims::static_size : 1)...};
  std::array<int, dim_count> sizes_{1, 1, 1, 1, 1};
  tp_grid grid_{};
};

//! A world whose size is known at compile time, for `loom::check_world<World>(mesh)` and the
//! `mesh_comm` constructor that takes it.
template <int N>
struct static_world {
  static constexpr int size = N;  //!< number of ranks
};

namespace detail {

template <class Mesh, int World>
constexpr fixed_message static_world_message() {
  if constexpr (Mesh::is_static) return fixed_message{Mesh{}.world_rule(World)};
  else return fixed_message{};
}

}  // namespace detail

//! Compile-time check that the static mesh `Mesh` has exactly `World` ranks: instantiating it
//! with a mismatch fails to compile with both sizes in the diagnostic ("mesh pp2 x tp2 has 4
//! ranks but the world has 8"). For a dynamic mesh it checks nothing (the run-time check in
//! `mesh_comm` does).
template <class Mesh, int World>
struct world_check {
  [[no_unique_address]] detail::mesh_rule_violated<detail::static_world_message<Mesh, World>()> check_{};
  //! True (the type exists only when the check passed).
  static constexpr bool ok = true;
};

}  // namespace loom
