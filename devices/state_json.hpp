// Every device's State as JSON, stored in a snapshot as CBOR, and back.
//
// A snapshot file is untrusted input, so decoding trusts nothing:
//  - decode_cbor() accepts only the CBOR that encode_cbor() writes (definite lengths, no tags,
//    text map keys without duplicates, at most cbor_max_depth levels), checked iteratively
//    before nlohmann's reader sees it: that reader recurses once per nesting level, and a few
//    hundred KiB of nested arrays or indefinite-length strings overflow the stack.
//  - state_from_json<T>() wants exact types (unsigned integers that fit the field, booleans,
//    byte strings), every field present and no other, and every invariant that save() always
//    meets and the device's restore() assumes without checking. What restore() checks itself
//    (queue sizes against the queue's maximum, features against those offered, the disk's
//    size, the UART's reserved bits, the vsock CID) is left to it; so is everything that
//    depends on the device rather than on the State alone.
// Every failure is Error("snapshot: <path>: <why>"), the path naming the field the way C++
// would: "blk.transport.queues[0].next_used".
//
// Restore decoded states into freshly built devices only, and throw the devices away if any
// restore() throws: each refuses a state that does not fit it, and leaves that device as it
// was, but devices restored before it keep their new state.
//
// Layout: one object per State, with the struct's field names as keys. Byte vectors
// (Serial::State::rx_fifo) are CBOR byte strings; the CowDisk bitmap is the runs of written
// sectors, [[first, count], ...].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "devices/cow_disk.hpp"
#include "devices/serial.hpp"
#include "devices/virtio_blk.hpp"
#include "devices/virtio_mmio.hpp"
#include "devices/virtio_vsock.hpp"
#include "core/state_codec.hpp"
#include "devices/virtqueue.hpp"

namespace agentvm {

// The largest disk a snapshot may hold, 256 GiB: decoding allocates its written-sector bitmap
// (64 MiB for this size) from the capacity the state names, so the capacity is bounded.
inline constexpr uint64_t max_snapshot_disk_sectors = 1ull << 29;

// Encoding, nlohmann's ADL style: `nlohmann::json j = uart.save();`. Never fails.
void to_json(nlohmann::json& j, const Serial::State& s);
void to_json(nlohmann::json& j, const Virtqueue::State& s);
void to_json(nlohmann::json& j, const VirtioMmioTransport::State& s);
void to_json(nlohmann::json& j, const CowDisk::State& s);
void to_json(nlohmann::json& j, const VirtioBlk::State& s);
void to_json(nlohmann::json& j, const VirtioVsock::State& s);

// Decoding: `auto s = state_from_json<Serial::State>(doc.at("serial"), "serial");` path names
// j in error messages. Throws Error. Defined for the six State types above only.
template <typename State>
State state_from_json(const nlohmann::json& j, std::string_view path);

template <>
Serial::State state_from_json<Serial::State>(const nlohmann::json& j, std::string_view path);
template <>
Virtqueue::State state_from_json<Virtqueue::State>(const nlohmann::json& j, std::string_view path);
template <>
VirtioMmioTransport::State state_from_json<VirtioMmioTransport::State>(const nlohmann::json& j,
                                                                       std::string_view path);
template <>
CowDisk::State state_from_json<CowDisk::State>(const nlohmann::json& j, std::string_view path);
template <>
VirtioBlk::State state_from_json<VirtioBlk::State>(const nlohmann::json& j, std::string_view path);
template <>
VirtioVsock::State state_from_json<VirtioVsock::State>(const nlohmann::json& j, std::string_view path);

} // namespace agentvm
