// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Which kind of group a pattern written once over groups runs on: `loom::detail::device_group`.

namespace loom::detail {

//! A group whose buffers live in device memory and whose work is enqueued on a stream (a
//! `loom::on_stream` binding): the patterns written once over groups (sequence parallelism,
//! expert parallelism) then take their device form (`loom/cuda/patterns.hpp`,
//! `loom/cuda/moe.hpp`).
template <class C>
concept device_group = requires { typename C::device_group_tag; };

}  // namespace loom::detail
