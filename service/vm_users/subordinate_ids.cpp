#include "service/vm_users/subordinate_ids.hpp"

#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {
namespace {

// Far above any real host's file (a line a user, tens of bytes each) and still cheap to read.
constexpr uintmax_t max_file_size = 16 << 20;

struct Delegation {
    std::string_view owner;
    uint64_t first = 0;
    uint64_t count = 0;
};

std::optional<Delegation> parse_line(std::string_view line)
{
    const size_t first_colon = line.find(':');
    const size_t second_colon = first_colon == line.npos ? line.npos : line.find(':', first_colon + 1);
    if (first_colon == 0 || second_colon == line.npos)
        return std::nullopt;
    const auto first = whole_number<uint32_t>(line.substr(first_colon + 1, second_colon - first_colon - 1));
    const auto count = whole_number<uint32_t>(line.substr(second_colon + 1));
    if (!first || !count || *count == 0)
        return std::nullopt;
    return Delegation{line.substr(0, first_colon), *first, *count};
}

} // namespace

void check_no_subordinate_ids_in(const JailIdRange& range, const std::string& path)
{
    std::error_code error;
    const uintmax_t size = std::filesystem::file_size(path, error);
    if (error == std::errc::no_such_file_or_directory)
        return;
    if (error)
        throw Error(fmt::format("--jail-uid-range: cannot read {} to check it: {}", path, error.message()));
    if (size > max_file_size)
        throw Error(fmt::format("--jail-uid-range: {} is larger than {} MiB; agentvm does not check it in part",
                                path, max_file_size >> 20));
    std::ifstream in(path, std::ios::binary);
    std::string text(size, '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    if (!in && !in.eof())
        throw Error(fmt::format("--jail-uid-range: cannot read {} to check it", path));
    text.resize(static_cast<size_t>(in.gcount()));

    const uint64_t range_end = uint64_t{range.first} + range.count;
    size_t line_number = 0;
    for (size_t at = 0; at < text.size();) {
        const size_t newline = text.find('\n', at);
        const size_t end = newline == std::string::npos ? text.size() : newline;
        const std::string_view line = std::string_view(text).substr(at, end - at);
        at = end + 1;
        ++line_number;
        const std::optional<Delegation> delegation = parse_line(line);
        if (!delegation || delegation->first >= range_end || delegation->first + delegation->count <= range.first)
            continue;
        throw Error(fmt::format("--jail-uid-range {}:{} overlaps {} line {}: ids {} to {} are {:.100}'s subordinate "
                                "ids, which its containers can own; choose a range outside them",
                                range.first, range.count, path, line_number, delegation->first,
                                delegation->first + delegation->count - 1, delegation->owner));
    }
}

} // namespace agentvm
