// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::nccl::from_mpi`: NCCL bootstrapped through MPI, one process per GPU
//! (`mpirun -np 4 prog`). Rank 0 creates the NCCL unique id and broadcasts it; each process uses
//! the device of its rank among the processes of its node (`MPI_Comm_split_type(SHARED)`), modulo
//! the node's device count. Failures are announced by MPI messages on a duplicate of the MPI
//! communicator: the failing rank sends its cause to every rank, and the others' bounded waits
//! probe for it. Needs `loom::mpi` and `loom::nccl`.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <mpi.h>

#include "loom/comm/nccl.hpp"

namespace loom::nccl {

//! Failure channel over MPI messages (see the file comment).
class mpi_failures final : public failure_channel {
 public:
  //! Uses a duplicate of `comm` (collective).
  explicit mpi_failures(MPI_Comm comm) {
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  mpi_failures(const mpi_failures&) = delete;
  mpi_failures& operator=(const mpi_failures&) = delete;
  ~mpi_failures() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& r : sends_) MPI_Request_free(&r);
    MPI_Comm_free(&comm_);
  }
  void post(int rank, const std::string& cause) override {
    if (posted_) return;
    posted_ = true;
    if (!first_) first_ = std::pair{rank, cause};
    message_ = std::to_string(rank) + '\n' + cause;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request q;
      MPI_Isend(message_.data(), static_cast<int>(message_.size()), MPI_CHAR, r, tag, comm_, &q);
      sends_.push_back(q);
    }
  }
  std::optional<std::pair<int, std::string>> poll() override {
    if (first_) return first_;
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &st);
    if (!flag) return std::nullopt;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(static_cast<std::size_t>(n), '\0');
    MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE);
    const auto nl = text.find('\n');
    first_ = std::pair{std::stoi(text.substr(0, nl)), nl == std::string::npos ? std::string() : text.substr(nl + 1)};
    return first_;
  }

 private:
  static constexpr int tag = 0x100f;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool posted_ = false;
  std::string message_;
  std::vector<MPI_Request> sends_;
  std::optional<std::pair<int, std::string>> first_;
};

//! Joins the NCCL world of the processes of `comm` (collective; see the file comment).
inline comm from_mpi(MPI_Comm world = MPI_COMM_WORLD, std::chrono::milliseconds timeout = default_comm_timeout) {
  int rank = 0, size = 1, local = 0, devices = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  LOOM_CUDA_TRY(cudaGetDeviceCount(&devices));
  ncclUniqueId id;
  if (rank == 0) LOOM_NCCL_TRY(ncclGetUniqueId(&id));
  MPI_Bcast(id.internal, sizeof id.internal, MPI_BYTE, 0, world);
  return comm(id, rank, size, devices > 0 ? local % devices : 0, std::make_shared<mpi_failures>(world), timeout);
}

}  // namespace loom::nccl
