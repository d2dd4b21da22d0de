#include "service/fleet/peer_listing.hpp"

#include <set>

#include <fmt/format.h>

#include "protocol/json_depth.hpp"

namespace agentvm {

bool node_scope_only(const HttpExchange& exchange)
{
    const std::optional<std::string> scope = exchange.header(list_scope_header);
    return scope && *scope == list_scope_node;
}

std::vector<std::string> forwarded_credentials(const HttpExchange& exchange)
{
    std::vector<std::string> lines;
    for (const char* name : {"Authorization", "X-API-KEY"})
        if (const std::optional<std::string> value = exchange.header(name))
            lines.push_back(fmt::format("{}: {}", name, *value));
    return lines;
}

std::optional<Json> peer_json(const PeerAnswer& answer, std::string& problem)
{
    if (!answer.problem.empty()) {
        problem = answer.problem;
        return std::nullopt;
    }
    if (answer.status != 200) {
        problem = fmt::format("answered HTTP {}", answer.status);
        return std::nullopt;
    }
    if (!json_depth_within(answer.body)) {
        problem = fmt::format("its answer nests deeper than {} levels", max_json_depth);
        return std::nullopt;
    }
    Json doc = Json::parse(answer.body, nullptr, false);
    if (doc.is_discarded()) {
        problem = "its answer is not JSON";
        return std::nullopt;
    }
    return doc;
}

std::string unreached_text(const std::vector<Unreached>& unreached)
{
    constexpr size_t max_problem = 200;
    std::string out;
    for (const Unreached& entry : unreached) {
        if (!out.empty())
            out += "; ";
        std::string problem;
        for (const char c : entry.problem.substr(0, max_problem))
            problem += c == ';' ? ',' : (c >= 0x20 && c < 0x7f ? c : '?');
        out += fmt::format("{} ({})", entry.node, problem);
    }
    return out;
}

Json merge_native_lists(Json local, const std::vector<PeerAnswer>& answers, std::vector<Unreached>& unreached)
{
    Json sandboxes = local.is_array() ? std::move(local) : Json::array();
    std::set<std::string> seen;
    for (const Json& sandbox : sandboxes)
        if (sandbox.is_object() && sandbox.contains("id") && sandbox["id"].is_string())
            seen.insert(sandbox["id"].get<std::string>());
    for (const PeerAnswer& answer : answers) {
        std::string problem;
        std::optional<Json> doc = peer_json(answer, problem);
        const Json* list = nullptr;
        if (doc) {
            const auto it = doc->find("sandboxes");
            if (doc->is_object() && it != doc->end() && it->is_array())
                list = &*it;
            for (size_t i = 0; list && i < list->size(); ++i) {
                const Json& entry = (*list)[i];
                if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_string())
                    list = nullptr;
            }
            if (!list)
                problem = "its answer is not a list of sandboxes";
        }
        if (!list) {
            unreached.push_back({answer.node, problem});
            continue;
        }
        for (const Json& entry : *list)
            if (seen.insert(entry["id"].get<std::string>()).second)
                sandboxes.push_back(entry);
    }
    Json unreached_json = Json::array();
    for (const Unreached& entry : unreached)
        unreached_json.push_back(Json{{"node", entry.node}, {"problem", entry.problem}});
    return Json{{"sandboxes", std::move(sandboxes)}, {"unreached", std::move(unreached_json)}};
}

} // namespace agentvm
