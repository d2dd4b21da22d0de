#include "core/state_codec.hpp"

#include <set>

namespace agentvm::state_codec {

[[noreturn]] void fail(std::string_view path, std::string_view why)
{
    throw Error(fmt::format("snapshot: {}: {}", path, why));
}

std::string element(std::string_view path, size_t index)
{
    return fmt::format("{}[{}]", path, index);
}

std::string printable(std::string_view text)
{
    constexpr size_t max = 40;
    std::string out;
    for (const char c : text.substr(0, max)) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\')
            out.push_back(c);
        else
            out += fmt::format("\\x{:02x}", u);
    }
    if (text.size() > max)
        out += "...";
    return out;
}

std::string_view describe(const json& j)
{
    switch (j.type()) {
    case json::value_t::null:
        return "null";
    case json::value_t::object:
        return "an object";
    case json::value_t::array:
        return "an array";
    case json::value_t::string:
        return "a string";
    case json::value_t::boolean:
        return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
        return "an integer";
    case json::value_t::number_float:
        return "a floating-point number";
    case json::value_t::binary:
        return "a byte string";
    case json::value_t::discarded:
        break;
    }
    return "nothing";
}

json runs_to_json(const std::vector<IndexRun>& runs)
{
    json j = json::array();
    for (const IndexRun& run : runs)
        j.push_back({run.first, run.count});
    return j;
}

std::vector<IndexRun> merge_runs(const std::vector<IndexRun>& runs, uint64_t min_gap, size_t max_runs)
{
    const auto merged_across = [](const std::vector<IndexRun>& in, uint64_t gap) {
        std::vector<IndexRun> out;
        for (const IndexRun& run : in) {
            if (!out.empty() && run.first - (out.back().first + out.back().count) <= gap)
                out.back().count = run.first + run.count - out.back().first;
            else
                out.push_back(run);
        }
        return out;
    };
    std::vector<IndexRun> merged = merged_across(runs, min_gap);
    for (uint64_t gap = std::max<uint64_t>(min_gap, 1); merged.size() > std::max<size_t>(max_runs, 1); gap *= 2)
        merged = merged_across(merged, gap);
    return merged;
}

std::vector<IndexRun> runs_from_json(const json& j, std::string_view path, uint64_t limit, std::string_view unit,
                                     std::string_view limit_name)
{
    if (!j.is_array())
        fail(path, fmt::format("expected an array, got {}", describe(j)));
    std::vector<IndexRun> runs;
    uint64_t next_free = 0;  // where a following run may start
    for (size_t i = 0; i < j.size(); ++i) {
        const auto where = [&] { return element(path, i); };
        if (!j[i].is_array() || j[i].size() != 2)
            fail(where(), fmt::format("expected a [first {}, count] pair, got {}", unit, describe(j[i])));
        const auto first = as_uint<uint64_t>(j[i][0], [&] { return where() + "[0]"; });
        const auto count = as_uint<uint64_t>(j[i][1], [&] { return where() + "[1]"; });
        if (count == 0 || first < next_free || first > limit || count > limit - first)
            fail(where(), fmt::format("{}s [{}, +{}) are empty, out of order or past {} {}", unit, first, count,
                                      limit_name, limit));
        next_free = first + count;
        runs.push_back({first, count});
    }
    return runs;
}

namespace {

[[noreturn]] void cbor_fail(size_t offset, std::string_view why)
{
    throw Error(fmt::format("snapshot: CBOR: at byte {}: {}", offset, why));
}

// Walks `bytes` as one CBOR item (RFC 8949), without recursion, and refuses what
// encode_cbor() never writes: integers and lengths not in their shortest form, indefinite
// lengths, tags, simple values other than false/true/null, map keys that are not text, duplicate keys, nesting beyond cbor_max_depth,
// bytes after the item. nlohmann's reader may then recurse: the depth is bounded.
void check_cbor(std::span<const uint8_t> bytes)
{
    struct Open {
        uint64_t items_left;  // a map counts its keys and values
        bool map;
        std::set<std::string_view> keys;
    };
    std::vector<Open> open;
    size_t pos = 0;
    do {
        const size_t start = pos;
        auto take = [&](uint64_t n) {
            if (n > bytes.size() - pos)
                cbor_fail(start, "truncated");
            const size_t at = pos;
            pos += n;
            return at;
        };
        bool is_key = false;
        if (!open.empty()) {
            is_key = open.back().map && open.back().items_left % 2 == 0;
            --open.back().items_left;
        }

        const uint8_t initial = bytes[take(1)];
        const unsigned major = initial >> 5;
        const unsigned info = initial & 0x1f;
        uint64_t arg = info;
        if (info >= 24 && info <= 27) {
            const size_t n = size_t{1} << (info - 24);
            const size_t at = take(n);
            arg = 0;
            for (size_t i = 0; i < n; ++i)
                arg = arg << 8 | bytes[at + i];
            // Integers and lengths in their shortest form, as encode_cbor() writes them, so a
            // state has one encoding; a float's bytes are its value, not a count.
            const uint64_t shortest_from = info == 24 ? 24 : uint64_t{1} << (8 * (n / 2));
            if (major != 7 && arg < shortest_from)
                cbor_fail(start, fmt::format("{} is not in its shortest form", arg));
        } else if (info == 31) {
            cbor_fail(start, "indefinite lengths are not accepted");
        } else if (info > 27) {
            cbor_fail(start, fmt::format("reserved additional information {}", info));
        }
        if (is_key && major != 3)
            cbor_fail(start, "a map key that is not a text string");

        switch (major) {
        case 0:  // unsigned and negative integers
        case 1:
            break;
        case 2:  // byte and text strings
        case 3: {
            const size_t at = take(arg);
            if (is_key) {
                // SAFETY: take() checked that [at, at + arg) lies inside bytes; char may alias.
                const std::string_view key(reinterpret_cast<const char*>(bytes.data() + at), arg);
                if (!open.back().keys.insert(key).second)
                    cbor_fail(start, fmt::format("duplicate key \"{}\"", printable(key)));
            }
            break;
        }
        case 4:  // arrays and maps
        case 5: {
            // Each item takes a byte at least: a larger count is a lie, and bounding it keeps
            // the doubled map count from overflowing.
            if (arg > bytes.size() - pos)
                cbor_fail(start, "truncated");
            if (open.size() == cbor_max_depth)
                cbor_fail(start, fmt::format("nested deeper than {} levels", cbor_max_depth));
            const uint64_t items = major == 5 ? 2 * arg : arg;
            if (items > 0)
                open.push_back({items, major == 5, {}});
            break;
        }
        case 6:
            cbor_fail(start, "tags are not accepted");
        default:
            // false, true, null, and half/single/double floats (their bytes were taken above).
            if (info != 20 && info != 21 && info != 22 && (info < 25 || info > 27))
                cbor_fail(start, fmt::format("simple value {} is not accepted", info == 24 ? arg : info));
            break;
        }
        while (!open.empty() && open.back().items_left == 0)
            open.pop_back();
    } while (!open.empty());
    if (pos != bytes.size())
        cbor_fail(pos, "bytes after the end of the item");
}

} // namespace

std::vector<uint8_t> encode_cbor(const json& j)
{
    return json::to_cbor(j);
}

json decode_cbor(std::span<const uint8_t> bytes)
{
    check_cbor(bytes);
    try {
        return json::from_cbor(bytes.begin(), bytes.end(), true, true, json::cbor_tag_handler_t::error);
    } catch (const json::exception& e) {
        throw Error(fmt::format("snapshot: CBOR: {}", e.what()));
    }
}

} // namespace agentvm::state_codec
