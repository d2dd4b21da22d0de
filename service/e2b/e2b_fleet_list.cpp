#include "service/e2b/e2b_fleet_list.hpp"

#include <set>

#include <fmt/format.h>

namespace agentvm {
namespace {

// The list's query arguments (control_plane_wire.cpp, parse_e2b_list_query).
constexpr const char* list_arguments[] = {"metadata", "state", "template", "startedAfter", "order", "limit", "nextToken"};

std::string percent_encoded(std::string_view text)
{
    std::string out;
    for (const char c : text) {
        const auto byte = static_cast<unsigned char>(c);
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'
            || c == '.' || c == '~')
            out += c;
        else
            out += fmt::format("%{:02X}", byte);
    }
    return out;
}

} // namespace

std::optional<PageKey> e2b_listed_key(const Json& entry)
{
    if (!entry.is_object())
        return std::nullopt;
    const auto id = entry.find("sandboxID");
    const auto started = entry.find("startedAt");
    if (id == entry.end() || !id->is_string() || started == entry.end() || !started->is_string())
        return std::nullopt;
    const std::optional<WallTime> at = parse_e2b_time(started->get_ref<const std::string&>());
    if (!at)
        return std::nullopt;
    return PageKey{std::chrono::duration_cast<std::chrono::milliseconds>(at->time_since_epoch()).count(),
                   id->get<std::string>()};
}

std::string e2b_list_target(const QueryArgument& argument)
{
    std::string target = "/v2/sandboxes";
    char separator = '?';
    for (const char* name : list_arguments) {
        if (const std::optional<std::string> value = argument(name)) {
            target += fmt::format("{}{}={}", separator, name, percent_encoded(*value));
            separator = '&';
        }
    }
    return target;
}

E2bFleetPage merge_e2b_lists(std::vector<E2bListed> local, bool local_more, const std::vector<PeerAnswer>& answers,
                             bool ascending, size_t limit, std::vector<Unreached>& unreached)
{
    std::vector<E2bListed> all = std::move(local);
    bool more = local_more;
    std::set<std::string> seen;
    for (const E2bListed& listed : all)
        seen.insert(listed.key.id);
    for (const PeerAnswer& answer : answers) {
        std::string problem;
        std::optional<Json> doc = peer_json(answer, problem);
        std::vector<E2bListed> theirs;
        bool understood = doc && doc->is_array();
        for (size_t i = 0; understood && i < doc->size(); ++i) {
            std::optional<PageKey> key = e2b_listed_key((*doc)[i]);
            if (!key)
                understood = false;
            else
                theirs.push_back(E2bListed{std::move(*key), std::move((*doc)[i])});
        }
        if (doc && !understood)
            problem = "its answer is not a list of sandboxes";
        if (!understood) {
            unreached.push_back({answer.node, problem});
            continue;
        }
        more = more || answer.next_token.has_value();
        for (E2bListed& listed : theirs)
            if (seen.insert(listed.key.id).second)
                all.push_back(std::move(listed));
    }
    std::vector<PageKey> keys;
    for (const E2bListed& listed : all)
        keys.push_back(listed.key);
    // Every entry is past the caller's token already (each node applied it).
    const Page page = page_of(keys, ascending, std::nullopt, limit);
    E2bFleetPage out;
    for (size_t index : page.entries)
        out.entries.push_back(std::move(all[index].entry));
    if (page.next_token)
        out.next_token = page.next_token;
    else if (more && !page.entries.empty())
        out.next_token = page_token(keys[page.entries.back()]);
    return out;
}

} // namespace agentvm
