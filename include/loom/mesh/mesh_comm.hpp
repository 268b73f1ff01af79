// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::mesh_comm`: a `loom::mesh` bound to a world communicator, with one communicator per
//! dimension (and per set of dimensions on request), each a `loom::counted` one so that every
//! dimension's traffic is counted separately.
//!
//! The mesh rank of a process is its world rank. The communicator of dimension `d` groups the
//! ranks that differ only in their `d` coordinate, ordered by it (so `of(dim::pp).rank()` is the
//! pipeline rank); the communicator of a set `s` (`group(dim::dp | dim::sp)`, the group ZeRO
//! shards over when the sequence is split) groups the ranks that differ only in the coordinates
//! of `s`, ordered row-major over them in mesh order. All are created with `split` on the
//! backend, so they exist on every backend, and share the world's abort and timeout.
//!
//! The world may be a host communicator (threads, MPI) or a device communicator with collectives
//! (`cuda_local`, `nccl`: `loom::device_collective_communicator`); on a device world every group
//! is a `counted` device communicator (its collectives take device memory and a stream; on
//! `nccl` the groups come from `ncclCommSplit`), counted exactly as on the host.
//!
//! When the mesh's tensor-parallel dimension is a grid (`tp<4, tp_kind::d2>`, see `loom::tp_grid`),
//! the constructor also splits the tp group into the grid's row, column and depth groups (in that
//! order, collective over the tp group), which `grid(g)` returns, counted as the others.
//!
//! Errors: a mesh whose size differs from the world's throws `config_error` on every rank from
//! the constructor, before any communication (it compares two local numbers); with a
//! `loom::static_world<N>` argument and a static mesh, the mismatch does not compile.

#include <array>
#include <cstddef>
#include <memory>
#include <utility>

#include "loom/comm/communicator.hpp"
#include "loom/comm/counting.hpp"
#include "loom/mesh/mesh.hpp"

namespace loom {

//! A mesh bound to a communicator (see the file comment).
template <class Mesh, group_communicator Comm>
class mesh_comm {
 public:
  using comm_type = counted<Comm>;  //!< the communicator of every group
  using mesh_type = Mesh;           //!< the mesh

  //! Binds `m` to `world` (collective over `world`): splits a private copy of the world and one
  //! communicator per dimension. Throws `config_error` (before communicating) unless the mesh
  //! has exactly `world.size()` ranks.
  mesh_comm(const Mesh& m, Comm& world) : m_(m) {
    m_.check_world(world.size());
    rank_ = world.rank();
    coords_ = m_.coords(rank_);
    world_ = std::make_unique<comm_type>(world.split(0, rank_));
    for (dim d : all_dims) (void)group(dim_set{d});
    if (const tp_grid& g = m_.grid(); g.is_grid()) {
      const int t = coord(dim::tp);
      for (grid_group x : {grid_group::row, grid_group::column, grid_group::depth})
        grid_groups_[static_cast<std::size_t>(x)] =
            std::make_unique<comm_type>(tp().inner().split(g.group_id(x, t), g.group_index(x, t)));
    }
  }
  //! As above, and for a static mesh checks at compile time that it has `N` ranks (the
  //! diagnostic names both sizes).
  template <int N>
  mesh_comm(const Mesh& m, Comm& world, static_world<N>) : mesh_comm(m, world) {
    static_assert(world_check<Mesh, N>::ok);
  }

  mesh_comm(mesh_comm&&) noexcept = default;
  mesh_comm& operator=(mesh_comm&&) noexcept = default;

  //! The mesh.
  const Mesh& mesh() const { return m_; }
  //! This process's mesh rank (its world rank).
  int rank() const { return rank_; }
  //! This rank's coordinates.
  const mesh_coords& coords() const { return coords_; }
  //! This rank's coordinate along `d`.
  int coord(dim d) const { return coords_[static_cast<std::size_t>(d)]; }
  //! Size of dimension `d` (1 when the mesh does not list it).
  int size(dim d) const { return m_.size(d); }

  //! A private duplicate of the world communicator (counted).
  comm_type& world() { return *world_; }
  //! The communicator along dimension `d`.
  comm_type& of(dim d) { return *groups_[dim_set{d}.bits]; }
  //! The data-parallel group.
  comm_type& dp() { return of(dim::dp); }
  //! The tensor-parallel group.
  comm_type& tp() { return of(dim::tp); }
  //! The pipeline group (run `loom::pipeline` on it).
  comm_type& pp() { return of(dim::pp); }
  //! The sequence-parallel group.
  comm_type& sp() { return of(dim::sp); }
  //! The expert-parallel group (the ranks that share the experts of a layer between them).
  comm_type& ep() { return of(dim::ep); }

  //! The grid group `g` holding this rank (the ranks of its row, its column or its depth line of
  //! the tensor-parallel grid, see `loom::grid_group`). Throws `config_error` when the mesh's
  //! tensor parallelism is 1D.
  comm_type& grid(grid_group g) {
    auto& c = grid_groups_[static_cast<std::size_t>(g)];
    if (!c)
      throw config_error("mesh " + m_.describe() + ": tensor parallel 1d has no " + text(to_string(g)) +
                         " group (only the grid kinds 2d, 2.5d and 3d do)");
    return *c;
  }

  //! The communicator of the ranks that differ only in the dimensions of `s`, ordered row-major
  //! over them in mesh order. Collective the first time a set is asked for: every rank must ask
  //! for new sets in the same order. Later calls return the same communicator.
  comm_type& group(dim_set s) {
    auto& g = groups_[s.bits];
    if (!g) g = std::make_unique<comm_type>(world_->inner().split(m_.group_id(s, rank_), m_.group_index(s, rank_)));
    return *g;
  }

  //! Sets the counts of the world and of every group created so far to zero.
  void reset_counters() {
    world_->reset_counters();
    for (auto& g : groups_)
      if (g) g->reset_counters();
    for (auto& g : grid_groups_)
      if (g) g->reset_counters();
  }

 private:
  Mesh m_;
  int rank_ = 0;
  mesh_coords coords_{};
  std::unique_ptr<comm_type> world_;
  std::array<std::unique_ptr<comm_type>, std::size_t{1} << dim_count> groups_;
  std::array<std::unique_ptr<comm_type>, 3> grid_groups_;
};

}  // namespace loom
