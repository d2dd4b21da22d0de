#include "service/e2b/e2b_network.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.hpp"
#include "service/egress/egress_policy.hpp"
#include "service/problem.hpp"

namespace agentvm {

namespace {

constexpr const char* all_traffic = "0.0.0.0/0";

std::vector<std::string> string_list(const Json& value, const char* name)
{
    if (!value.is_array() || value.size() > max_egress_rules)
        throw_bad_field(fmt::format("\"network.{}\" must be an array of at most {} strings", name, max_egress_rules));
    std::vector<std::string> out;
    for (const Json& item : value) {
        if (!item.is_string())
            throw_bad_field(fmt::format("\"network.{}\" must hold strings", name));
        out.push_back(item.get<std::string>());
    }
    return out;
}

[[noreturn]] void not_done(const std::string& field, const char* why)
{
    throw_bad_field(fmt::format("\"{}\": agentvm does not do {}; leave it out", field, why));
}

} // namespace

std::optional<EgressRules> e2b_egress_rules(const E2bNetworkFields& fields)
{
    std::vector<std::string> allow_out;
    std::vector<std::string> deny_out;
    if (fields.network) {
        const Json& network = *fields.network;
        if (!network.is_object())
            throw_bad_field("\"network\" must be an object");
        for (const auto& [key, value] : network.items()) {
            if (key == "allowOut")
                allow_out = string_list(value, "allowOut");
            else if (key == "denyOut")
                deny_out = string_list(value, "denyOut");
            else if (key == "allowPublicTraffic") {
                // Traffic to a sandbox's ports is not checked for a token by serve (docs/e2b.md).
                if (!value.is_boolean() || !value.get<bool>())
                    not_done("network.allowPublicTraffic", "token checks on traffic to a sandbox's ports");
            } else if (key == "rules" || key == "egressProxy" || key == "maskRequestHost" || key == "httpsPorts") {
                if (!value.is_null())
                    not_done("network." + key, "this network option");
            } else {
                throw_bad_field(fmt::format("\"network\": unknown field \"{:.64}\" (allowOut, denyOut)", key));
            }
        }
    }
    if (!fields.allow_internet_access && !fields.network)
        return std::nullopt;
    const bool deny_all = std::find(deny_out.begin(), deny_out.end(), all_traffic) != deny_out.end();
    std::erase(deny_out, all_traffic);
    const bool internet = fields.allow_internet_access.value_or(true) && !deny_all;
    EgressRules rules;
    if (internet)
        rules.allow.push_back("*");
    rules.allow.insert(rules.allow.end(), allow_out.begin(), allow_out.end());
    rules.deny = std::move(deny_out);
    try {
        EgressPolicy::parse(rules.allow, rules.deny);
    } catch (const Error& e) {
        throw_bad_field(fmt::format("\"network\": {}", e.what()));
    }
    return rules;
}

bool e2b_internet_allowed(const std::optional<EgressRules>& rules)
{
    return rules && std::find(rules->allow.begin(), rules->allow.end(), "*") != rules->allow.end();
}

Json e2b_network_json(const EgressRules& rules)
{
    Json allow_out = Json::array();
    for (const std::string& rule : rules.allow)
        if (rule != "*")
            allow_out.push_back(rule);
    Json deny_out = rules.deny;
    if (!e2b_internet_allowed(rules))
        deny_out.push_back(all_traffic);
    return Json{{"allowOut", std::move(allow_out)}, {"denyOut", std::move(deny_out)}};
}

} // namespace agentvm
