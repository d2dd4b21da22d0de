// The snapshot state's encoding kit, shared by every layer that saves state (devices, the
// VMM): CBOR checked before it is parsed, JSON objects decoded field by field with refusals
// that name the field ("snapshot: <path>: <why>"), runs of indices. Every refusal is an Error.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace agentvm::state_codec {

using nlohmann::json;

[[noreturn]] void fail(std::string_view path, std::string_view why);
std::string element(std::string_view path, size_t index);
// Text from the file, safe to put in a message: short, anything unusual escaped.
std::string printable(std::string_view text);
// Finer than json::type_name(), which calls every number a "number".
std::string_view describe(const json& j);

// path() names the value in a refusal; it is built only then, since a snapshot holds
// thousands of numbers and restoring one is on every episode's critical path.
template <typename T, typename Path>
    requires std::unsigned_integral<T> && (!std::same_as<T, bool>)
T as_uint(const json& v, const Path& path)
{
    constexpr uint64_t max = std::numeric_limits<T>::max();
    if (v.is_number_unsigned()) {
        const auto n = v.get<uint64_t>();
        if (n > max)
            fail(path(), fmt::format("{} is out of range 0..{}", n, max));
        return static_cast<T>(n);
    }
    if (v.is_number_integer()) {
        // CBOR gives only negative integers this type; JSON built in memory may hold others.
        const auto n = v.get<int64_t>();
        if (n < 0 || static_cast<uint64_t>(n) > max)
            fail(path(), fmt::format("{} is out of range 0..{}", n, max));
        return static_cast<T>(n);
    }
    fail(path(), fmt::format("expected an unsigned integer, got {}", describe(v)));
}

// One JSON object being decoded. Every field must be there, and done() refuses fields nobody
// read: a corrupted or misspelt key is an error, not an extra to ignore beside a missing one.
class Fields {
public:
    Fields(const json& j, std::string_view path) : j_(j), path_(path)
    {
        if (!j.is_object())
            fail(path_, fmt::format("expected an object, got {}", describe(j)));
    }

    const std::string& path() const { return path_; }
    std::string path(std::string_view key) const { return fmt::format("{}.{}", path_, key); }

    const json& at(std::string_view key)
    {
        const auto it = j_.find(key);
        if (it == j_.end())
            fail(path(key), "missing");
        read_.push_back(key);
        return *it;
    }

    template <typename T>
    T uint(std::string_view key)
    {
        return as_uint<T>(at(key), [&] { return path(key); });
    }

    // null for none.
    template <typename T>
    std::optional<T> optional_uint(std::string_view key)
    {
        const json& v = at(key);
        if (v.is_null())
            return std::nullopt;
        return as_uint<T>(v, [&] { return path(key); });
    }

    bool boolean(std::string_view key)
    {
        const json& v = at(key);
        if (!v.is_boolean())
            fail(path(key), fmt::format("expected a boolean, got {}", describe(v)));
        return v.get<bool>();
    }

    std::vector<uint8_t> bytes(std::string_view key)
    {
        const json& v = at(key);
        if (!v.is_binary())
            fail(path(key), fmt::format("expected a byte string, got {}", describe(v)));
        if (v.get_binary().has_subtype())
            fail(path(key), "a byte string with a subtype, which snapshots do not use");
        return v.get_binary();
    }

    const json& array(std::string_view key)
    {
        const json& v = at(key);
        if (!v.is_array())
            fail(path(key), fmt::format("expected an array, got {}", describe(v)));
        return v;
    }

    void done() const
    {
        if (read_.size() == j_.size())
            return;
        for (auto it = j_.begin(); it != j_.end(); ++it)
            if (std::find(read_.begin(), read_.end(), it.key()) == read_.end())
                fail(path_, fmt::format("unknown field \"{}\"", printable(it.key())));
    }

private:
    const json& j_;
    std::string path_;
    std::vector<std::string_view> read_;
};

// A run of indices [first, first + count): a disk's written sectors, guest RAM's warm pages.
struct IndexRun {
    uint64_t first = 0;
    uint64_t count = 0;

    bool operator==(const IndexRun&) const = default;
};

// Ascending, disjoint runs with every gap of at most min_gap indices closed, then wider gaps
// (doubling) until at most max_runs remain: fewer, longer runs that also cover what lay
// between them. max_runs 0 counts as 1.
std::vector<IndexRun> merge_runs(const std::vector<IndexRun>& runs, uint64_t min_gap, size_t max_runs);

// Runs as snapshots store them, [[first, count], ...], and back. Decoding wants them ascending,
// disjoint, non-empty and below `limit`, and refuses with "snapshot: <path>...", saying
// "<unit>s [first, +count) are empty, out of order or past <limit_name> <limit>".
json runs_to_json(const std::vector<IndexRun>& runs);
std::vector<IndexRun> runs_from_json(const json& j, std::string_view path, uint64_t limit,
                                     std::string_view unit, std::string_view limit_name);

// Deep enough for any snapshot layout; shallow enough for nlohmann's recursive reader.
inline constexpr size_t cbor_max_depth = 64;

std::vector<uint8_t> encode_cbor(const json& j);
// Exactly one CBOR item, nothing after it. Throws Error("snapshot: CBOR: ...").
json decode_cbor(std::span<const uint8_t> bytes);

} // namespace agentvm::state_codec

namespace agentvm {
using state_codec::decode_cbor;
using state_codec::encode_cbor;
using state_codec::cbor_max_depth;
using state_codec::IndexRun;
} // namespace agentvm
