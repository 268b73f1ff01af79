// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Sequence parallelism: the sequence of a microbatch split over ranks, and the attention that
//! still sees all of it. Four patterns (Megatron-SP itself, which splits the sequence over the
//! tensor-parallel group outside its regions, is in `loom/exec/tensor_parallel.hpp`):
//!
//! - **Ulysses** (DeepSpeed-Ulysses, Jacobs et al. 2023, §3): each of `u` ranks holds `N/u` tokens
//!   of all heads; an all-to-all before attention gives each rank all `N` tokens of `H/u` heads,
//!   attention runs locally, and a second all-to-all gives the tokens back. The heads must be
//!   divisible by `u`. Per layer (forward) a rank sends `4 N h / u` elements' worth of all-to-all
//!   input (Q, K, V and the output; the paper's "4Nh/P per link"), of which `(u-1)/u` leaves it.
//! - **Ring attention** (Liu, Zaharia and Abbeel 2023): each of `R` ranks keeps its queries and
//!   passes its keys and values around the ring, `R - 1` times in the forward; each block of
//!   scores is merged into the output with the log-sum-exp update (online softmax, Milakov and
//!   Gimelshein 2018; Dao et al. 2022). With a causal mask the sequence is cut into `2R` chunks
//!   and rank `r` holds chunks `r` and `2R-1-r` (zig-zag, as Brandon et al. 2023's striped
//!   attention and ring-flash-attention balance it): every step then costs every rank two
//!   unmasked chunk blocks (one on the diagonal step) and the masked blocks are skipped, not
//!   computed. The backward passes K/V around again (`R - 1` times) and the K/V gradients once
//!   more (`R` times, the last hop bringing them home).
//! - **USP** (Fang and Zhao 2024, "USP: A Unified Sequence Parallelism Approach"): `sp = u x R`
//!   ranks, Ulysses inside groups of `u` adjacent ranks, ring attention across the `R` groups (each
//!   group's tokens are its ring position's zig-zag chunks, split contiguously over its `u` ranks).
//!   Ulysses alone is `R = 1` and ring attention alone `u = 1`: `usp_attention` is the one
//!   implementation of all three (and, with `u = R = 1`, of plain local attention).
//!
//! - **DSP** (Zhao et al., ICML 2025): for tensors over two sequence dimensions, shard one at a
//!   time and switch with one all-to-all between attentions over different dimensions
//!   (`dsp_switch`).
//! - **TokenRing** (Wang et al. 2024): ring attention's layout with the queries travelling and
//!   K and V kept at home, the partial outputs returning the other way (`token_ring_attention`).
//!
//! Layouts: Q, K, V, O are `[tokens][heads][head_dim]`, the log-sum-exp `[tokens][heads]`.
//! Sums run over their index in increasing order and blocks are merged in a fixed order
//! (documented at `ring_attention`), so deterministic runs are reproducible bit for bit; a
//! single-rank reference that merges the same blocks in the same order reproduces them
//! (`attention_block_forward`/`attention_block_backward` are public for that).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/group_kind.hpp"
#include "loom/exec/pattern_math.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/mesh/mesh.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! The sequence-parallel patterns of this file, plus Megatron-SP (over the tp group).
enum class sp_kind : unsigned char { megatron, ulysses, ring, usp };

//! Name of a kind ("megatron", "ulysses", "ring", "usp").
constexpr std::string_view to_string(sp_kind k) noexcept {
  switch (k) {
    case sp_kind::megatron: return "megatron";
    case sp_kind::ulysses: return "ulysses";
    case sp_kind::ring: return "ring";
    case sp_kind::usp: return "usp";
  }
  return "?";
}

//! USP's default Ulysses degree for `sp` ranks: the largest divisor of `sp` not above sqrt(sp).
constexpr int default_ulysses_degree(int sp) {
  int best = 1;
  for (int d = 1; d * d <= sp; ++d)
    if (sp % d == 0) best = d;
  return best;
}

//! How a sequence of `sequence` tokens is split over `u x ring` ranks (USP's layout; Ulysses is
//! `ring = 1`, ring attention `u = 1`). Rank `r` is ring position `r / u`, Ulysses index `r % u`.
struct seq_split {
  int sequence = 1;  //!< tokens of the whole sequence
  int u = 1;         //!< Ulysses degree
  int ring = 1;      //!< ring degree

  //! Chunks of the sequence: `2 * ring` (zig-zag) when `ring > 1`, else 1.
  constexpr int chunks() const { return ring > 1 ? 2 * ring : 1; }
  //! Tokens per chunk.
  constexpr int chunk_tokens() const { return sequence / chunks(); }
  //! Tokens of one ring position (all its Ulysses ranks together).
  constexpr int position_tokens() const { return sequence / ring; }
  //! Tokens of one rank.
  constexpr int rank_tokens() const { return sequence / (ring * u); }
  //! The chunks of ring position `p`, in local order.
  constexpr std::pair<int, int> position_chunks(int p) const { return {p, 2 * ring - 1 - p}; }
  //! Global position of local token `i` of ring position `p` (its tokens in local order).
  constexpr int position_token(int p, int i) const {
    if (ring == 1) return i;
    const int c = chunk_tokens();
    return i < c ? p * c + i : (2 * ring - 1 - p) * c + (i - c);
  }
  //! Global position of local token `i` of sequence-parallel rank `r`.
  constexpr int token(int r, int i) const { return position_token(r / u, (r % u) * rank_tokens() + i); }

  //! The rule the split breaks for a layer with `heads` attention heads on this rank, or "".
  constexpr text rule(int heads) const {
    if (u < 1 || ring < 1)
      return "sequence parallel: degrees must be positive (ulysses " + detail::to_text(u) + ", ring " +
             detail::to_text(ring) + ")";
    if (heads % u != 0)
      return "ulysses: " + detail::to_text(heads) + " attention heads are not divisible by the Ulysses degree " +
             detail::to_text(u);
    if (sequence % (chunks() * u) != 0) {
      if (ring > 1)
        return "ring attention: the sequence of " + detail::to_text(sequence) + " tokens is not divisible into " +
               detail::to_text(chunks()) + " zig-zag chunks x " + detail::to_text(u) + " Ulysses ranks";
      return "sequence parallel: the sequence of " + detail::to_text(sequence) + " tokens is not divisible by " +
             detail::to_text(u) + " ranks";
    }
    return {};
  }
};

//! The mask between query chunk `qc` and key chunk `kc` (chunks in sequence order).
constexpr block_mask chunk_mask(int qc, int kc, bool causal) {
  if (!causal || kc < qc) return block_mask::full;
  return kc == qc ? block_mask::causal : block_mask::none;
}

//! Sizes of an attention call: `heads` per rank, `head_dim`, the scale of the scores.
struct attention_dims {
  int heads = 1;       //!< heads in the tensors
  int head_dim = 1;    //!< features per head
  double scale = 1.0;  //!< scores are scale * q . k (usually 1/sqrt(head_dim))
};


//! Faults a sequence-parallel pattern can be asked to commit on a device group, for the tests
//! that show the race detector names them.
struct sp_faults {
  bool skip_kv_free_wait = false;  //!< ring attention receives the next K/V block without waiting for the kernels that read the buffer
};

namespace detail {

//! An attention block's forward in a host loop.
template <class T>
void host_forward(const attention_block<T>& b) {
  std::vector<T> ob(static_cast<std::size_t>(b.head_dim));  // each key's weight once per item
  for (std::size_t e = 0; e < b.query_items(); ++e) b.forward(e, ob.data());
}
//! An attention block's backward in host loops: the query gradients, then the key and value
//! gradients.
template <class T>
void host_backward(const attention_block<T>& b) {
  if (b.dq != nullptr)
    for (std::size_t e = 0; e < b.query_items(); ++e) b.backward_query(e);
  if (b.dk != nullptr || b.dv != nullptr)
    for (std::size_t e = 0; e < b.key_items(); ++e) b.backward_key(e);
}

//! How a pattern allocates, computes and communicates on a group of type `C`: here, host
//! groups (threads, MPI, their `counted` wrappers, or none): `std::vector` buffers, the per-item
//! functions of `loom/exec/pattern_math.hpp` in loops, blocking-on-wait point-to-point. The
//! device form (`on_stream` groups) is the specialisation in `loom/cuda/patterns.hpp`, with the
//! same members; the patterns below are written once over them.
template <class C>
struct sp_space {
  static_assert(!device_group<C>,
                "loom: a sequence-parallel pattern over a device group (loom::on_stream) needs "
                "#include <loom/cuda/patterns.hpp>, which defines its device form");
  template <class T>
  using buffer = std::vector<T>;
  using request = typename C::request;
  struct state {};
  template <class T>
  static buffer<T> make(C*, std::size_t n) {
    return buffer<T>(n, T{});
  }
  template <class T>
  static void fill(C*, state&, std::span<T> x, T value) {
    std::fill(x.begin(), x.end(), value);
  }
  template <class T>
  static void copy(C*, state&, std::span<const T> from, std::span<T> to) {
    if (from.data() != to.data()) std::copy(from.begin(), from.end(), to.begin());
  }
  template <class T>
  static void forward(C*, state&, const attention_block<T>& b) {
    host_forward(b);
  }
  template <class T>
  static void backward(C*, state&, const attention_block<T>& b) {
    host_backward(b);
  }
  template <class T>
  static void delta(C*, state&, const attention_delta_rows<T>& f, std::size_t rows) {
    for (std::size_t r = 0; r < rows; ++r) f(r);
  }
  template <class T>
  static void move(C*, state&, const ulysses_move<T>& f) {
    for (std::size_t w = 0; w < f.l.size(); ++w) f(w);
  }
  template <class T>
  static void merge(C*, state&, const attention_merge_rows<T>& f, std::size_t rows) {
    for (std::size_t r = 0; r < rows; ++r) f(r);
  }
  template <class T>
  static void dsp(C*, state&, const dsp_move<T>& f, std::size_t ranks) {
    for (std::size_t w = 0; w < f.size(ranks); ++w) f(w);
  }
  template <class T>
  static void all_to_all(C* c, state&, std::span<const T> in, std::span<T> out) {
    c->all_to_all(in, out);
  }
  static void open(C*, state&, std::span<const channel>) {}
  static void begin(C*, state&) {}
  static void end(C*, state&) {}
  static auto isend(C* c, state&, int peer, std::span<const std::byte> b, const sp_faults&) { return c->isend(peer, b); }
  static auto irecv(C* c, state&, int peer, std::span<std::byte> b, const sp_faults&) { return c->irecv(peer, b); }
  template <class R>
  static void wait(C* c, state&, R& r) {
    c->wait(r);
  }
};

//! All of a pattern's buffer (a `std::vector` or a device buffer) as a span.
template <class B>
auto whole(B& b) {
  return std::span(b.data(), b.size());
}

}  // namespace detail

//! One block of attention, merged into a running output: query rows `[q0, q0 + nq)` of `q`
//! against key/value rows `[k0, k0 + nk)` of `k`, `v` (with `block_mask::causal`, row `i` sees
//! keys up to `k0 + (i - q0)`). For each row and head the block's softmax output `o_b` and
//! log-sum-exp `l_b` are merged into `o`, `lse` by `l = log(e^lse + e^l_b)`,
//! `o = o e^(lse - l) + o_b e^(l_b - l)`; start with `lse = -inf`, `o = 0` (the first merge is
//! exact). Host memory; `attention_block::forward` per item, which the device patterns run as
//! a kernel.
template <class T>
void attention_block_forward(const attention_dims& a, std::span<const T> q, std::span<const T> k, std::span<const T> v,
                             std::span<T> o, std::span<T> lse, int q0, int nq, int k0, int nk, block_mask mask) {
  const attention_block<T> b{q.data(), k.data(), v.data(), o.data(), lse.data(), nullptr, nullptr, nullptr, nullptr, nullptr,
                             a.heads, a.head_dim, static_cast<T>(a.scale), q0, nq, k0, nk, mask};
  detail::host_forward(b);
}

//! `delta[i][h] = sum_d do[i][h][d] o[i][h][d]`, the row term of the attention backward.
template <class T>
void attention_delta(const attention_dims& a, std::span<const T> o, std::span<const T> dout, std::span<T> delta) {
  const attention_delta_rows<T> f{o.data(), dout.data(), delta.data(), a.head_dim};
  for (std::size_t r = 0; r < delta.size(); ++r) f(r);
}

//! The backward of one block (FlashAttention's, Dao et al. 2022, Alg. 4, with the final
//! log-sum-exp): for each visible pair, `p = e^(scale q.k - lse)`, `dv += p do`,
//! `ds = p (do.v - delta)`, `dq += scale ds k`, `dk += scale ds q`; each query gradient over its
//! keys in order, each key and value gradient over its query rows in order.
//! `dq`, `dk`, `dv` may be empty to skip that gradient. Host memory.
template <class T>
void attention_block_backward(const attention_dims& a, std::span<const T> q, std::span<const T> k, std::span<const T> v,
                              std::span<const T> lse, std::span<const T> dout, std::span<const T> delta, std::span<T> dq,
                              std::span<T> dk, std::span<T> dv, int q0, int nq, int k0, int nk, block_mask mask) {
  auto ptr = [](std::span<T> s) { return s.empty() ? nullptr : s.data(); };
  const attention_block<T> b{q.data(), k.data(), v.data(), nullptr, const_cast<T*>(lse.data()), dout.data(), delta.data(), ptr(dq),
                             ptr(dk), ptr(dv), a.heads, a.head_dim, static_cast<T>(a.scale), q0, nq, k0, nk, mask};
  detail::host_backward(b);
}

//! Ring attention over the ranks of `ring` (see the file comment), for this rank's `2` zig-zag
//! chunks (or, on a ring of one, its whole sequence as one chunk). Order of merging, which a
//! reference must follow to be bitwise equal: ring position `p` holds chunks `(p, 2R-1-p)`; at
//! step `s = 0..R-1` it holds the keys of position `(p - s) mod R`; for each of its query chunks
//! (lower first) the key chunks of that step (lower first) are merged in, skipping masked ones.
//! The gradient of a key chunk of position `p` accumulates on positions `p, p+1, ..., p-1` in
//! that order (it travels with the keys). Messages go to `(p+1) mod R`, from `(p-1) mod R`: K and
//! V together (`2 x tokens x heads x head_dim`) `R-1` times in the forward and the backward, and
//! their gradients `R` times in the backward.
//!
//! Written once for every group: on a host group (threads, MPI) the blocks run in host loops and
//! the transfers complete on `wait`; on a device group (`loom::on_stream` over a `cuda_local` or
//! `nccl` group, with `loom/cuda/patterns.hpp`) every block is a kernel on the group's stream and
//! every transfer a stream-ordered send and receive, with no host synchronisation: the K/V block
//! of the next step is received into the second buffer while the current block's kernels read
//! the first (double buffering), the receive ordered after the kernels that last read its buffer.
//! The tensors passed in are then device memory. Construction is collective over the ring (a
//! device group opens its ring channels).
template <class C, class T>
class ring_attention {
  using space = detail::sp_space<C>;
  using buffer = typename space::template buffer<T>;

 public:
  //! A ring attention on `ring` for `tokens` tokens of this rank (two equal zig-zag chunks when
  //! the ring has more than one rank), `dims` heads and head size.
  ring_attention(C* ring, int tokens, attention_dims dims, bool causal)
      : c_(ring), R_(ring == nullptr ? 1 : ring->size()), pos_(ring == nullptr ? 0 : ring->rank()), T_(tokens),
        a_(dims), causal_(causal) {
    if (R_ > 1 && tokens % 2 != 0)
      throw config_error("ring attention: " + std::to_string(tokens) + " tokens per rank cannot form two zig-zag chunks");
    elems_ = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) * static_cast<std::size_t>(dims.head_dim);
    kv_ = space::template make<T>(c_, 2 * elems_);
    kv_next_ = space::template make<T>(c_, 2 * elems_);
    if (R_ > 1) {
      dkv_ = space::template make<T>(c_, 2 * elems_);
      dkv_next_ = space::template make<T>(c_, 2 * elems_);
      std::vector<channel> chans;
      for (int p = 0; p < R_; ++p) chans.push_back({p, (p + 1) % R_});
      space::open(c_, st_, chans);
    }
    delta_ = space::template make<T>(c_, static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads));
  }

  //! Chunk blocks skipped (fully masked) in the last forward.
  int skipped_blocks() const { return skipped_; }
  //! Chunk blocks computed in the last forward.
  int computed_blocks() const { return computed_; }
  //! Commits `f` from now on (device groups; the tests of the race detector).
  void inject(const sp_faults& f) { faults_ = f; }

  //! `o` and `lse` (log-sum-exp per row and head) of this rank's queries over the whole sequence.
  void forward(std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<T> o, std::span<T> lse) {
    space::begin(c_, st_);
    space::fill(c_, st_, o, T{});
    space::fill(c_, st_, lse, -std::numeric_limits<T>::infinity());
    load(k, v);
    skipped_ = computed_ = 0;
    for (int s = 0; s < R_; ++s) {
      typename space::request rr{}, sr{};
      if (s + 1 < R_) {
        rr = space::irecv(c_, st_, prev(), std::as_writable_bytes(detail::whole(kv_next_)), faults_);
        sr = space::isend(c_, st_, next(), std::as_bytes(detail::whole(kv_)), faults_);
      }
      for_blocks(s, true, [&](int q0, int k0, int n, block_mask m) {
        space::forward(c_, st_,
                       attention_block<T>{q.data(), kv_.data(), kv_.data() + elems_, o.data(), lse.data(), nullptr, nullptr, nullptr,
                                          nullptr, nullptr, a_.heads, a_.head_dim, static_cast<T>(a_.scale), q0, n, k0, n, m});
      });
      if (s + 1 < R_) {
        space::wait(c_, st_, rr);
        space::wait(c_, st_, sr);
        std::swap(kv_, kv_next_);
      }
    }
    space::end(c_, st_);
  }

  //! Gradients of this rank's `q`, `k`, `v` (overwritten) given the forward's `o`, `lse` and the
  //! output gradient `dout`.
  void backward(std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<const T> o,
                std::span<const T> lse, std::span<const T> dout, std::span<T> dq, std::span<T> dk, std::span<T> dv) {
    space::begin(c_, st_);
    space::delta(c_, st_, attention_delta_rows<T>{o.data(), dout.data(), delta_.data(), a_.head_dim}, lse.size());
    space::fill(c_, st_, dq, T{});
    load(k, v);
    buffer& acc = R_ > 1 ? dkv_ : kv_next_;  // one rank: accumulate in place
    space::fill(c_, st_, detail::whole(acc), T{});
    for (int s = 0; s < R_; ++s) {
      typename space::request rr{}, sr{}, gr{}, gs{};
      if (s + 1 < R_) {
        rr = space::irecv(c_, st_, prev(), std::as_writable_bytes(detail::whole(kv_next_)), faults_);
        sr = space::isend(c_, st_, next(), std::as_bytes(detail::whole(kv_)), faults_);
      }
      buffer& g = R_ > 1 ? dkv_ : kv_next_;
      for_blocks(s, false, [&](int q0, int k0, int n, block_mask m) {
        space::backward(c_, st_,
                        attention_block<T>{q.data(), kv_.data(), kv_.data() + elems_, nullptr, const_cast<T*>(lse.data()),
                                           dout.data(), delta_.data(), dq.data(), g.data(), g.data() + elems_, a_.heads,
                                           a_.head_dim, static_cast<T>(a_.scale), q0, n, k0, n, m});
      });
      if (R_ > 1) {
        gr = space::irecv(c_, st_, prev(), std::as_writable_bytes(detail::whole(dkv_next_)), faults_);
        gs = space::isend(c_, st_, next(), std::as_bytes(detail::whole(dkv_)), faults_);
      }
      if (s + 1 < R_) {
        space::wait(c_, st_, rr);
        space::wait(c_, st_, sr);
      }
      if (R_ > 1) {
        space::wait(c_, st_, gr);
        space::wait(c_, st_, gs);
        std::swap(dkv_, dkv_next_);
      }
      if (s + 1 < R_) std::swap(kv_, kv_next_);
    }
    buffer& g = R_ > 1 ? dkv_ : kv_next_;
    space::copy(c_, st_, std::span<const T>(g.data(), elems_), dk);
    space::copy(c_, st_, std::span<const T>(g.data() + elems_, elems_), dv);
    space::end(c_, st_);
  }

 private:
  int prev() const { return (pos_ + R_ - 1) % R_; }
  int next() const { return (pos_ + 1) % R_; }
  //! K and V into the first K/V buffer.
  void load(std::span<const T> k, std::span<const T> v) {
    space::copy(c_, st_, k, std::span<T>(kv_.data(), elems_));
    space::copy(c_, st_, v, std::span<T>(kv_.data() + elems_, elems_));
  }

  //! Calls `f(q0, k0, rows, mask)` for the unmasked chunk blocks of step `s`, in merge order
  //! (counting them when `count`).
  template <class F>
  void for_blocks(int s, bool count, F&& f) {
    if (R_ == 1) {
      computed_ += count ? 1 : 0;
      f(0, 0, T_, causal_ ? block_mask::causal : block_mask::full);
      return;
    }
    const int c = T_ / 2, src = (pos_ - s + R_) % R_;
    const int qch[2] = {pos_, 2 * R_ - 1 - pos_}, kch[2] = {src, 2 * R_ - 1 - src};
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb) {
        const block_mask m = chunk_mask(qch[qa], kch[kb], causal_);
        if (m == block_mask::none) {
          skipped_ += count ? 1 : 0;
          continue;
        }
        computed_ += count ? 1 : 0;
        f(qa * c, kb * c, c, m);
      }
  }

  C* c_;
  int R_, pos_, T_;
  attention_dims a_;
  bool causal_;
  std::size_t elems_ = 0;
  typename space::state st_{};
  buffer kv_, kv_next_, dkv_, dkv_next_, delta_;
  sp_faults faults_{};
  int skipped_ = 0, computed_ = 0;
};

//! TokenRing (Wang et al. 2024, "TokenRing: An Efficient Parallelism Framework for Infinite-Context
//! LLMs via Bidirectional Communication", §3): ring attention's layout (each of `R` positions holds
//! two zig-zag chunks of Q, K and V) with the roles of the tensors exchanged. **K and V never leave
//! their owner**; the queries travel (position `p` sends the queries it holds to `p - 1`), and in
//! the forward the partial outputs with their log-sum-exp travel the other way, straight back to
//! the queries' owner, so both directions of the links carry data at once. At step `s` position
//! `p` holds the queries of owner `(p + s) mod R` and attends them to its own keys (the zig-zag
//! chunk blocks, masked ones skipped, as `ring_attention`).
//!
//! **Forward.** Step 0 merges the owner's own blocks straight into its output, as ring attention
//! does. At step `s > 0` the position computes the owner's blocks into a fresh partial (for each
//! query chunk, the key chunks lower first, from `o = 0`, `lse = -inf`) and sends it (`tokens x
//! heads x (head_dim + 1)` values) to the owner, which has posted a receive per step into its own
//! buffer and merges them in step order, `s = 1, ..., R - 1` (`attention_merge_rows`): the result
//! does not depend on the order in which the partials arrive. The key sources are merged in ring
//! attention's order (`p, p - 1, ...`), but a step's two key chunks are merged with each other
//! before they meet the running output, so the forward is not ring attention's bits;
//! `token_ring_reference_forward` is the single-rank computation in TokenRing's order.
//!
//! **Backward** (the paper leaves it open; loom's design). The queries travel again with their
//! output gradient, log-sum-exp and `delta` (`tokens x heads x (2 head_dim + 2)` values per hop,
//! sent before the step's blocks), and with their gradient `dQ`, which accumulates as it travels
//! (sent after the step's blocks) and takes one more hop home at the end. `dK` and `dV` accumulate
//! at their owner from the query blocks that visit it. Both accumulate in ring attention's order
//! (a query's key sources `p, p - 1, ...`; a key's query sources `p, p + 1, ...`), so the backward
//! is **bitwise ring attention's backward** given the same `o` and `lse`.
//!
//! **Volume per position** (elements, `n = tokens x heads x head_dim`, `m = tokens x heads`):
//! forward `(R - 1) n` queries one way and `(R - 1)(n + m)` partials the other; backward
//! `(R - 1)(2n + 2m)` query bundles and `R n` query gradients; no K or V. Ring attention sends
//! `2 (R - 1) n` forward and `2 (R - 1) n + 2 R n` backward, all one way.
//!
//! Written once for every group, as `ring_attention` (`detail::sp_space`): on a host group
//! (threads, MPI) host loops and blocking waits; on a device group (`loom::on_stream` over a
//! `cuda_local` or `nccl` group, with `loom/cuda/patterns.hpp`) every block and merge a kernel and
//! every transfer stream-ordered, the buffers the object's own (device memory), each receive
//! ordered after the kernels that last read its buffer. Construction is collective over a device
//! ring (it opens a channel from every position to every other: the partials go to their owner).
template <class C, class T>
class token_ring_attention {
  using space = detail::sp_space<C>;
  using buffer = typename space::template buffer<T>;

 public:
  //! TokenRing on `ring` for `tokens` tokens of this rank (two equal zig-zag chunks when the ring
  //! has more than one rank), `dims` heads and head size.
  token_ring_attention(C* ring, int tokens, attention_dims dims, bool causal)
      : c_(ring), R_(ring == nullptr ? 1 : ring->size()), pos_(ring == nullptr ? 0 : ring->rank()), T_(tokens), a_(dims),
        causal_(causal) {
    if (R_ > 1 && tokens % 2 != 0)
      throw config_error("token ring attention: " + std::to_string(tokens) + " tokens per rank cannot form two zig-zag chunks");
    n_ = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) * static_cast<std::size_t>(dims.head_dim);
    m_ = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads);
    cur_ = space::template make<T>(c_, 2 * n_ + 2 * m_);
    gq_ = space::template make<T>(c_, n_);
    if (R_ > 1) {
      const std::size_t part = n_ + m_;
      qcur_ = space::template make<T>(c_, n_);
      qnext_ = space::template make<T>(c_, n_);
      sent_ = space::template make<T>(c_, static_cast<std::size_t>(R_ - 1) * part);
      got_ = space::template make<T>(c_, static_cast<std::size_t>(R_ - 1) * part);
      nxt_ = space::template make<T>(c_, 2 * n_ + 2 * m_);
      gq_next_ = space::template make<T>(c_, n_);
      std::vector<channel> chans;
      for (int p = 0; p < R_; ++p)
        for (int q = 0; q < R_; ++q)
          if (p != q) chans.push_back({p, q});
      space::open(c_, st_, chans);
    }
  }

  //! Elements this position sends in one forward and one backward (see the class comment).
  std::size_t forward_elements() const { return R_ == 1 ? 0 : static_cast<std::size_t>(R_ - 1) * (2 * n_ + m_); }
  //! As `forward_elements`, for the backward.
  std::size_t backward_elements() const {
    return R_ == 1 ? 0 : static_cast<std::size_t>(R_ - 1) * (2 * n_ + 2 * m_) + static_cast<std::size_t>(R_) * n_;
  }
  //! Elements of the buffers a TokenRing over `ring` positions holds for `tokens` tokens and
  //! `dims` (device memory on a device group): the travelling bundle and the query gradient, and
  //! with more than one position their second copies, the travelling queries' two buffers and the
  //! partials sent and received.
  static std::size_t buffer_elements(int ring, int tokens, attention_dims dims) {
    const std::size_t n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) * static_cast<std::size_t>(dims.head_dim),
                      m = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads);
    const std::size_t one = 2 * n + 2 * m + n;
    return ring > 1 ? 2 * one + 2 * n + 2 * static_cast<std::size_t>(ring - 1) * (n + m) : one;
  }
  //! Commits `f` from now on (device groups; see `ring_attention::inject`).
  void inject(const sp_faults& f) { faults_ = f; }

  //! `o` and `lse` of this rank's queries over the whole sequence (see the class comment).
  void forward(std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<T> o, std::span<T> lse) {
    space::begin(c_, st_);
    space::fill(c_, st_, o, T{});
    space::fill(c_, st_, lse, -std::numeric_limits<T>::infinity());
    if (R_ == 1) {
      blocks(pos_, q, k, v, o, lse);
      return space::end(c_, st_);
    }
    const std::size_t part = n_ + m_;
    space::copy(c_, st_, q, detail::whole(qcur_));
    std::vector<typename space::request> recvs(static_cast<std::size_t>(R_)), sends;
    // The partial of step s comes from position p - s. The last one (s = R - 1) comes from p + 1,
    // which also sends the queries: it is posted after their receives, in the order they are sent.
    auto post_partial = [&](int st) {
      recvs[static_cast<std::size_t>(st)] =
          space::irecv(c_, st_, (pos_ - st + R_) % R_, std::as_writable_bytes(slot(got_, st, part)), faults_);
    };
    for (int st = 1; st < R_ - 1; ++st) post_partial(st);
    for (int st = 0; st < R_; ++st) {
      typename space::request rq{}, sq{};
      if (st + 1 < R_) {
        rq = space::irecv(c_, st_, next(), std::as_writable_bytes(detail::whole(qnext_)), faults_);
        sq = space::isend(c_, st_, prev(), std::as_bytes(detail::whole(qcur_)), faults_);
        if (st + 1 == R_ - 1) post_partial(R_ - 1);
      }
      const int owner = (pos_ + st) % R_;
      const std::span<const T> qs(qcur_.data(), n_);
      if (st == 0) {
        blocks(owner, qs, k, v, o, lse);
      } else {
        const std::span<T> out = slot(sent_, st, part);
        space::fill(c_, st_, out.first(n_), T{});
        space::fill(c_, st_, out.subspan(n_), -std::numeric_limits<T>::infinity());
        blocks(owner, qs, k, v, out.first(n_), out.subspan(n_, m_));
        sends.push_back(space::isend(c_, st_, owner, std::as_bytes(out), faults_));
      }
      if (st + 1 < R_) {
        space::wait(c_, st_, rq);
        space::wait(c_, st_, sq);
        std::swap(qcur_, qnext_);
      }
    }
    // Merge in step order, whatever the order of arrival.
    for (int st = 1; st < R_; ++st) {
      space::wait(c_, st_, recvs[static_cast<std::size_t>(st)]);
      const std::span<T> in = slot(got_, st, part);
      space::merge(c_, st_, attention_merge_rows<T>{o.data(), lse.data(), in.data(), in.data() + n_, a_.head_dim}, m_);
    }
    for (auto& r : sends) space::wait(c_, st_, r);
    space::end(c_, st_);
  }

  //! Gradients of this rank's `q`, `k`, `v` (overwritten) given the forward's `o`, `lse` and the
  //! output gradient `dout`.
  void backward(std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<const T> o, std::span<const T> lse,
                std::span<const T> dout, std::span<T> dq, std::span<T> dk, std::span<T> dv) {
    space::begin(c_, st_);
    // The travelling bundle: queries, output gradient, log-sum-exp, delta; and the query gradient.
    space::copy(c_, st_, q, std::span<T>(cur_.data(), n_));
    space::copy(c_, st_, dout, std::span<T>(cur_.data() + n_, n_));
    space::copy(c_, st_, lse, std::span<T>(cur_.data() + 2 * n_, m_));
    space::delta(c_, st_, attention_delta_rows<T>{o.data(), dout.data(), cur_.data() + 2 * n_ + m_, a_.head_dim}, m_);
    space::fill(c_, st_, dk, T{});
    space::fill(c_, st_, dv, T{});
    space::fill(c_, st_, detail::whole(gq_), T{});
    for (int st = 0; st < R_; ++st) {
      typename space::request rb{}, sb{}, rg{}, sg{};
      if (st + 1 < R_) {
        rb = space::irecv(c_, st_, next(), std::as_writable_bytes(detail::whole(nxt_)), faults_);
        rg = space::irecv(c_, st_, next(), std::as_writable_bytes(detail::whole(gq_next_)), faults_);
        sb = space::isend(c_, st_, prev(), std::as_bytes(detail::whole(cur_)), faults_);
      }
      const int owner = (pos_ + st) % R_;
      for_blocks(owner, [&](int q0, int k0, int n, block_mask mask) {
        space::backward(c_, st_,
                        attention_block<T>{cur_.data(), k.data(), v.data(), nullptr, cur_.data() + 2 * n_, cur_.data() + n_,
                                           cur_.data() + 2 * n_ + m_, gq_.data(), dk.data(), dv.data(), a_.heads, a_.head_dim,
                                           static_cast<T>(a_.scale), q0, n, k0, n, mask});
      });
      if (st + 1 < R_) {
        sg = space::isend(c_, st_, prev(), std::as_bytes(detail::whole(gq_)), faults_);
        space::wait(c_, st_, rb);
        space::wait(c_, st_, rg);
        space::wait(c_, st_, sb);
        space::wait(c_, st_, sg);
        std::swap(cur_, nxt_);
        std::swap(gq_, gq_next_);
      }
    }
    if (R_ == 1) {
      space::copy(c_, st_, std::span<const T>(gq_.data(), n_), dq);
      return space::end(c_, st_);
    }
    // The last query gradient held belongs to p - 1: one hop home; ours comes from p + 1.
    auto rg = space::irecv(c_, st_, next(), std::as_writable_bytes(dq), faults_);
    auto sg = space::isend(c_, st_, prev(), std::as_bytes(detail::whole(gq_)), faults_);
    space::wait(c_, st_, rg);
    space::wait(c_, st_, sg);
    space::end(c_, st_);
  }

  //! Calls `f(q0, k0, rows, mask)` for the unmasked chunk blocks of the queries of `owner` against
  //! this position's keys, in merge order (query chunk, then key chunk, lower first).
  template <class F>
  void for_blocks(int owner, F&& f) const {
    if (R_ == 1) return f(0, 0, T_, causal_ ? block_mask::causal : block_mask::full);
    const int c = T_ / 2;
    const int qch[2] = {owner, 2 * R_ - 1 - owner}, kch[2] = {pos_, 2 * R_ - 1 - pos_};
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb)
        if (const block_mask m = chunk_mask(qch[qa], kch[kb], causal_); m != block_mask::none) f(qa * c, kb * c, c, m);
  }

 private:
  int prev() const { return (pos_ + R_ - 1) % R_; }
  int next() const { return (pos_ + 1) % R_; }
  static std::span<T> slot(buffer& b, int st, std::size_t part) {
    return std::span<T>(b.data(), b.size()).subspan(static_cast<std::size_t>(st - 1) * part, part);
  }
  void blocks(int owner, std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<T> o, std::span<T> lse) {
    for_blocks(owner, [&](int q0, int k0, int n, block_mask mask) {
      space::forward(c_, st_,
                     attention_block<T>{q.data(), k.data(), v.data(), o.data(), lse.data(), nullptr, nullptr, nullptr, nullptr, nullptr,
                                        a_.heads, a_.head_dim, static_cast<T>(a_.scale), q0, n, k0, n, mask});
    });
  }

  C* c_;
  int R_, pos_, T_;
  attention_dims a_;
  bool causal_;
  std::size_t n_ = 0, m_ = 0;
  typename space::state st_{};
  sp_faults faults_{};
  buffer cur_, nxt_, gq_, gq_next_, qcur_, qnext_, sent_, got_;
};

//! TokenRing's forward on one rank (`token_ring_attention`'s order of merging), for the `R`
//! positions' local tensors `q[p]`, `k[p]`, `v[p]` (each `tokens x heads x head_dim`, its two
//! zig-zag chunks): `o[p]`, `lse[p]` receive what position `p` computes.
template <class T>
void token_ring_reference_forward(const attention_dims& a, int tokens, bool causal, const std::vector<std::vector<T>>& q,
                                  const std::vector<std::vector<T>>& k, const std::vector<std::vector<T>>& v,
                                  std::vector<std::vector<T>>& o, std::vector<std::vector<T>>& lse) {
  const int R = static_cast<int>(q.size());
  const auto n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(a.heads) * static_cast<std::size_t>(a.head_dim);
  const auto m = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(a.heads);
  const T inf = std::numeric_limits<T>::infinity();
  o.assign(static_cast<std::size_t>(R), std::vector<T>(n, T{}));
  lse.assign(static_cast<std::size_t>(R), std::vector<T>(m, -inf));
  for (int p = 0; p < R; ++p)
    for (int st = 0; st < R; ++st) {
      const int src = (p - st + R) % R;  // the position whose keys step st brings
      std::vector<T> y(n, T{}), lb(m, -inf);
      std::span<T> out_o = st == 0 ? std::span<T>(o[static_cast<std::size_t>(p)]) : std::span<T>(y);
      std::span<T> out_l = st == 0 ? std::span<T>(lse[static_cast<std::size_t>(p)]) : std::span<T>(lb);
      const int c = R == 1 ? tokens : tokens / 2;
      const int qch[2] = {p, 2 * R - 1 - p}, kch[2] = {src, 2 * R - 1 - src};
      for (int qa = 0; qa < (R == 1 ? 1 : 2); ++qa)
        for (int kb = 0; kb < (R == 1 ? 1 : 2); ++kb) {
          const block_mask mask = R == 1 ? (causal ? block_mask::causal : block_mask::full) : chunk_mask(qch[qa], kch[kb], causal);
          if (mask == block_mask::none) continue;
          attention_block_forward<T>(a, q[static_cast<std::size_t>(p)], k[static_cast<std::size_t>(src)],
                                     v[static_cast<std::size_t>(src)], out_o, out_l, qa * c, c, kb * c, c, mask);
        }
      if (st == 0) continue;
      const attention_merge_rows<T> merge{o[static_cast<std::size_t>(p)].data(), lse[static_cast<std::size_t>(p)].data(), y.data(),
                                          lb.data(), a.head_dim};
      for (std::size_t r = 0; r < m; ++r) merge(r);
    }
}

//! DSP's switch of the sharded sequence dimension (Zhao et al., ICML 2025, "DSP: Dynamic Sequence
//! Parallelism for Multi-Dimensional Transformers", §4): a tensor over two sequence dimensions,
//! `[A][B][F]` (`F` features per token, e.g. time x space x hidden), is sharded over the `P`
//! ranks of `c` along one of them at a time, so that an attention over the other dimension is
//! local; one all-to-all moves it to the other sharding before an attention over the first.
//! `to_first` takes this rank's `[A][B/P][F]` (sharded along B) to `[A/P][B][F]` (sharded along
//! A, rank `r` holding rows `[r A/P, (r+1) A/P)`); `to_second` is its inverse, and each is the
//! other's backward (an all-to-all is a permutation). Per switch a rank's all-to-all input is its
//! whole shard, `A B F / P` elements, of which `(P-1)/P` leave it; Ulysses needs four such
//! exchanges per attention (Q, K, V and the output) where DSP needs one per change of
//! dimension. The layout changes are copies, so a DSP run equals the single-rank computation bit
//! for bit. Written once over `detail::sp_space`: host groups (threads, MPI, their `counted`
//! wrappers) pack and unpack in host loops; device groups (`loom::on_stream` with
//! `loom/cuda/patterns.hpp`) as kernels (`dsp_move`) around the group's all-to-all on its stream.
template <class C, class T>
class dsp_switch {
  using space = detail::sp_space<C>;

 public:
  //! A switch over `c` (null: one rank, the identity; a device form needs its group, of one rank
  //! for degree 1) of `[a][b][features]` tensors.
  dsp_switch(C* c, int a, int b, int features) : c_(c), p_(c == nullptr ? 1 : c->size()), a_(a), b_(b), f_(features) {
    for (auto [name, n] : {std::pair<const char*, int>{"first", a}, {"second", b}})
      if (n % p_ != 0)
        throw config_error("dsp: the " + std::string(name) + " sequence dimension of " + std::to_string(n) +
                           " tokens is not divisible by the " + std::to_string(p_) + " sequence-parallel ranks");
    n_ = static_cast<std::size_t>(a) * static_cast<std::size_t>(b) * static_cast<std::size_t>(features) / static_cast<std::size_t>(p_);
    if (p_ > 1) {
      send_ = space::template make<T>(c_, n_);
      recv_ = space::template make<T>(c_, n_);
    }
  }
  //! Elements of a shard (either sharding).
  std::size_t shard_elements() const { return n_; }

  //! `[A][B/P][F]` to `[A/P][B][F]`.
  void to_first(std::span<const T> in, std::span<T> out) { exchange(in, out, true); }
  //! `[A/P][B][F]` to `[A][B/P][F]`: the inverse of `to_first`.
  void to_second(std::span<const T> in, std::span<T> out) { exchange(in, out, false); }

 private:
  // Block j of the all-to-all buffer, `[A/P][B/P][F]`, is what goes to (or came from) rank j
  // (`dsp_move`).
  void exchange(std::span<const T> in, std::span<T> out, bool to_a) {
    if (in.size() != n_ || out.size() != n_)
      throw std::length_error("loom dsp_switch: a shard of " + std::to_string(in.size()) + " -> " + std::to_string(out.size()) +
                              " elements; the tensor's shards have " + std::to_string(n_));
    if (p_ == 1) return space::copy(c_, st_, in, out);
    const auto P = static_cast<std::size_t>(p_), ap = static_cast<std::size_t>(a_) / P, bp = static_cast<std::size_t>(b_) / P,
               B = static_cast<std::size_t>(b_), F = static_cast<std::size_t>(f_);
    // Packed from the input's sharding, unpacked into the other one.
    space::dsp(c_, st_, dsp_move<T>{in.data(), send_.data(), ap, bp, B, F, !to_a, true}, P);
    space::all_to_all(c_, st_, std::span<const T>(send_.data(), n_), std::span<T>(recv_.data(), n_));
    space::dsp(c_, st_, dsp_move<T>{recv_.data(), out.data(), ap, bp, B, F, to_a, false}, P);
  }

  C* c_;
  int p_, a_, b_, f_;
  std::size_t n_ = 0;
  typename space::state st_{};
  typename space::template buffer<T> send_, recv_;
};

//! Ulysses' all-to-alls over `c` (`u` ranks). `scatter_heads`: `in` holds `count` tensors
//! `[tokens][heads][head_dim]` of this rank's tokens; `out` receives `count` tensors
//! `[u x tokens][heads/u][head_dim]`: every rank's tokens (in rank order) of this rank's group of
//! heads. `gather_heads` is its inverse (and each is the other's backward). Written once for
//! host and device groups (see `ring_attention`): the layout changes are `ulysses_move` per
//! element, a kernel on a device group's stream.
template <class C, class T>
class ulysses {
  using space = detail::sp_space<C>;

 public:
  //! Ulysses over `c` (null or one rank: the identity) for `count` tensors of `tokens` tokens.
  ulysses(C* c, int count, int tokens, int heads, int head_dim)
      : c_(c), u_(c == nullptr ? 1 : c->size()) {
    if (heads % u_ != 0)
      throw config_error("ulysses: " + std::to_string(heads) + " attention heads are not divisible by the Ulysses degree " +
                         std::to_string(u_));
    l_ = {static_cast<std::size_t>(u_), static_cast<std::size_t>(count), static_cast<std::size_t>(tokens),
          static_cast<std::size_t>(heads), static_cast<std::size_t>(head_dim)};
    if (u_ > 1) {
      send_ = space::template make<T>(c_, l_.size());
      recv_ = space::template make<T>(c_, l_.size());
    }
  }

  //! Heads to tokens (see the class comment).
  void scatter_heads(std::span<const T> in, std::span<T> out) { exchange(in, out, true); }
  //! Tokens to heads: the inverse of `scatter_heads`.
  void gather_heads(std::span<const T> in, std::span<T> out) { exchange(in, out, false); }

 private:
  //! The buffer gathered from `in` by one map, exchanged, and scattered into `out` by the other.
  void exchange(std::span<const T> in, std::span<T> out, bool from_heads) {
    if (u_ == 1) return space::copy(c_, st_, in, out);
    space::move(c_, st_, ulysses_move<T>{in.data(), send_.data(), l_, from_heads, true});
    space::all_to_all(c_, st_, std::span<const T>(send_.data(), l_.size()), std::span<T>(recv_.data(), l_.size()));
    space::move(c_, st_, ulysses_move<T>{recv_.data(), out.data(), l_, !from_heads, false});
  }

  C* c_;
  int u_;
  ulysses_layout l_{};
  typename space::state st_{};
  typename space::template buffer<T> send_, recv_;
};

//! USP attention (see the file comment): Ulysses over `ulysses_comm` (`u` ranks), ring attention
//! over `ring_comm` (`R` ranks) on the ring position's tokens (`u x tokens`, its two zig-zag
//! chunks) for `heads / u` heads. Either communicator may be null (degree 1) on the host; a
//! device form needs both groups (of one rank for degree 1). `forward` keeps in `stash`
//! (`stash_size()` elements) what `backward` needs.
template <class C, class T>
class usp_attention {
  using space = detail::sp_space<C>;

 public:
  //! Attention over `tokens` tokens of this rank, `dims.heads` heads on this rank. With
  //! `token_ring` the ring part is TokenRing (`token_ring_attention`: the queries travel, K and V
  //! stay) instead of ring attention.
  usp_attention(C* ulysses_comm, C* ring_comm, int tokens, attention_dims dims, bool causal, bool token_ring = false)
      : u_(ulysses_comm == nullptr ? 1 : ulysses_comm->size()),
        t_(tokens),
        dims_(dims),
        inner_{dims.heads / u_, dims.head_dim, dims.scale},
        a2a3_(ulysses_comm, 3, tokens, dims.heads, dims.head_dim),
        a2a1_(ulysses_comm, 1, tokens, dims.heads, dims.head_dim),
        ring_(ring_comm, tokens * u_, inner_, causal) {
    n_ = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) * static_cast<std::size_t>(dims.head_dim);
    packed_ = space::template make<T>(ring_comm, n_);
    grads_ = space::template make<T>(ring_comm, 3 * n_);
    if (token_ring) token_ring_.emplace(ring_comm, tokens * u_, inner_, causal);
  }

  //! Elements of the per-call stash: Q, K, V, O and the log-sum-exp in the ring's layout.
  std::size_t stash_size() const { return 4 * n_ + lse_size(); }
  //! Elements of the buffers a `usp_attention` over a Ulysses group of `u` ranks and a ring of
  //! `ring` ranks holds for `tokens` tokens and `dims` (device memory on a device group): the
  //! Ulysses exchanges' send and receive buffers (3 tensors and 1, when `u > 1`), the ring's
  //! current and next K/V (and their gradients' pair when `ring > 1`) and its deltas, the
  //! backward's packed output gradient and Q/K/V gradients; with `token_ring` TokenRing's too
  //! (`token_ring_attention::buffer_elements` on the ring's `u x tokens` tokens and `heads / u`
  //! heads).
  static std::size_t buffer_elements(int u, int ring, int tokens, attention_dims dims, bool token_ring = false) {
    const std::size_t n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) *
                          static_cast<std::size_t>(dims.head_dim);
    const std::size_t exchanges = u > 1 ? 2 * (3 * n + n) : 0;
    const std::size_t kv = (ring > 1 ? 8 : 4) * n + static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads);
    const std::size_t tr =
        token_ring ? token_ring_attention<C, T>::buffer_elements(ring, tokens * u, {dims.heads / u, dims.head_dim, dims.scale}) : 0;
    return exchanges + kv + n + 3 * n + tr;
  }
  //! The ring attention inside (for its block counts).
  const ring_attention<C, T>& ring() const { return ring_; }
  //! Commits `f` from now on (see `ring_attention::inject`; TokenRing's too).
  void inject(const sp_faults& f) {
    ring_.inject(f);
    if (token_ring_) token_ring_->inject(f);
  }

  //! `qkv` is `[3][tokens][heads][head_dim]` (Q, K, V of this rank's tokens); `o` receives
  //! `[tokens][heads][head_dim]`.
  void forward(std::span<const T> qkv, std::span<T> o, std::span<T> stash) {
    std::span<T> s3 = stash.subspan(0, 3 * n_), so = stash.subspan(3 * n_, n_), sl = stash.subspan(4 * n_, lse_size());
    a2a3_.scatter_heads(qkv, s3);
    if (token_ring_) {
      token_ring_->forward(s3.subspan(0, n_), s3.subspan(n_, n_), s3.subspan(2 * n_, n_), so, sl);
      return a2a1_.gather_heads(std::span<const T>(so), o);
    }
    ring_.forward(s3.subspan(0, n_), s3.subspan(n_, n_), s3.subspan(2 * n_, n_), so, sl);
    a2a1_.gather_heads(std::span<const T>(so), o);
  }

  //! `dqkv` (`[3][tokens][heads][head_dim]`) receives the gradients of Q, K, V given `dout`.
  void backward(std::span<const T> dout, std::span<T> dqkv, std::span<const T> stash) {
    std::span<const T> s3 = stash.subspan(0, 3 * n_), so = stash.subspan(3 * n_, n_), sl = stash.subspan(4 * n_, lse_size());
    std::span<T> dos(packed_.data(), n_);
    a2a1_.scatter_heads(dout, dos);
    std::span<T> g(grads_.data(), 3 * n_);
    if (token_ring_)
      token_ring_->backward(s3.subspan(0, n_), s3.subspan(n_, n_), s3.subspan(2 * n_, n_), so, sl, dos, g.subspan(0, n_),
                            g.subspan(n_, n_), g.subspan(2 * n_, n_));
    else
      ring_.backward(s3.subspan(0, n_), s3.subspan(n_, n_), s3.subspan(2 * n_, n_), so, sl, dos, g.subspan(0, n_),
                     g.subspan(n_, n_), g.subspan(2 * n_, n_));
    a2a3_.gather_heads(std::span<const T>(g), dqkv);
  }

 private:
  std::size_t lse_size() const { return static_cast<std::size_t>(t_) * static_cast<std::size_t>(dims_.heads); }

  int u_, t_;
  attention_dims dims_, inner_;
  ulysses<C, T> a2a3_, a2a1_;
  ring_attention<C, T> ring_;
  std::optional<token_ring_attention<C, T>> token_ring_{};
  std::size_t n_ = 0;
  typename space::template buffer<T> packed_, grads_;
};

//! The sizes of a transformer layer that tensor and sequence parallelism split.
struct layer_shape {
  int sequence = 1;  //!< tokens per sequence
  int heads = 1;     //!< attention heads
  int ffn = 1;       //!< MLP hidden features
};

//! The rule a layer of shape `l` breaks on `tp` tensor-parallel ranks with its sequence split by
//! `kind` over `sp` ranks (Megatron-SP over the tp ranks; USP as `ulysses` x `sp / ulysses`,
//! `ulysses = 0` for `default_ulysses_degree`), or "". One sentence naming the values.
constexpr text sharding_rule(layer_shape l, int tp, int sp, sp_kind kind, int ulysses = 0) {
  if (text r = tp_rule(tp, l.heads, l.ffn); !r.empty()) return r;
  if (sp < 1) return "sequence parallel: sp " + detail::to_text(sp) + " is not a positive number of ranks";
  const int heads = l.heads / tp;
  switch (kind) {
    case sp_kind::megatron:
      if (l.sequence % tp != 0)
        return "megatron sequence parallel: the sequence of " + detail::to_text(l.sequence) + " tokens is not divisible by tp " +
               detail::to_text(tp);
      return {};
    case sp_kind::ulysses: return seq_split{l.sequence, sp, 1}.rule(heads);
    case sp_kind::ring: return seq_split{l.sequence, 1, sp}.rule(heads);
    case sp_kind::usp: {
      const int u = ulysses == 0 ? default_ulysses_degree(sp) : ulysses;
      if (u < 1 || sp % u != 0)
        return "usp: the Ulysses degree " + detail::to_text(u) + " does not divide sp " + detail::to_text(sp);
      return seq_split{l.sequence, u, sp / u}.rule(heads);
    }
  }
  return {};
}

//! Compile-time check of a layer of shape `L` on the static mesh `Mesh` (its `tp` and `sp` sizes)
//! with the sequence split by `Kind`: a shape the split cannot divide does not compile, and the
//! diagnostic carries `sharding_rule`'s sentence ("ulysses: 6 attention heads are not divisible by
//! the Ulysses degree 4").
template <layer_shape L, class Mesh, sp_kind Kind, int Ulysses = 0>
struct static_sharding {
  static_assert(Mesh::is_static, "loom::static_sharding needs a mesh of static dimensions");
  //! The rule broken, or empty.
  static constexpr detail::fixed_message rule{sharding_rule(L, Mesh{}.size(dim::tp), Mesh{}.size(dim::sp), Kind, Ulysses)};
  [[no_unique_address]] detail::mesh_rule_violated<rule> check_{};
  //! True (the type exists only when the check passed).
  static constexpr bool ok = true;
};

}  // namespace loom
