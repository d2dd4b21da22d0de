#include "service/sandbox_ids.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

bool is_lower_hex(std::string_view text)
{
    return std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string random_hex_digits(size_t digits, const char* what)
{
    unsigned char bytes[16];
    const size_t count = (digits + 1) / 2;
    if (::getrandom(bytes, count, 0) != static_cast<ssize_t>(count))
        throw_errno(what);
    std::string hex;
    for (size_t i = 0; i < count; ++i)
        hex += fmt::format("{:02x}", bytes[i]);
    hex.resize(digits);
    return hex;
}

} // namespace

std::string node_id_problem(std::string_view node)
{
    if (node.empty() || node.size() > max_node_id)
        return fmt::format("a node id has 1 to {} characters, not {}", max_node_id, node.size());
    for (char c : node)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return "a node id has only a-z, 0-9 and '-'";
    if (node.front() == '-' || node.back() == '-')
        return "a node id starts and ends with a letter or digit";
    if (node.find("--") != std::string_view::npos)
        return "a node id has no \"--\"";
    return "";
}

std::string node_id_from_host_name(std::string_view host)
{
    std::string node;
    for (char c : host.substr(0, host.find('.'))) {
        const auto lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        const bool kept = (lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9');
        if (kept)
            node += lower;
        else if (!node.empty() && node.back() != '-')
            node += '-';
    }
    if (node.size() > max_node_id)
        node.resize(max_node_id);
    while (!node.empty() && node.back() == '-')
        node.pop_back();
    return node.empty() ? "node" : node;
}

std::string default_node_id()
{
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0)
        throw_errno("gethostname for the node id");
    return node_id_from_host_name(host);
}

std::string new_instance_id()
{
    return random_hex_digits(instance_hex, "getrandom for serve's instance id");
}

std::string new_sandbox_id(std::string_view node, std::string_view instance)
{
    return fmt::format("{}-{}-{}", node, instance, random_hex_digits(random_hex, "getrandom for a sandbox id"));
}

std::optional<SandboxIdParts> parse_sandbox_id(std::string_view id)
{
    const size_t tail = 1 + instance_hex + 1 + random_hex;
    if (id.size() <= tail)
        return std::nullopt;
    const std::string_view node = id.substr(0, id.size() - tail);
    const std::string_view rest = id.substr(node.size());
    if (rest[0] != '-' || rest[1 + instance_hex] != '-' || !is_lower_hex(rest.substr(1, instance_hex))
        || !is_lower_hex(rest.substr(2 + instance_hex)) || !node_id_problem(node).empty())
        return std::nullopt;
    return SandboxIdParts{std::string(node), std::string(rest.substr(1, instance_hex))};
}

std::optional<Refusal> lost_sandbox(std::string_view id, std::string_view node, std::string_view instance)
{
    const std::optional<SandboxIdParts> parts = parse_sandbox_id(id);
    if (!parts || (parts->node == node && parts->instance == instance))
        return std::nullopt;
    if (parts->node != node)
        return Refusal{ServiceError::sandbox_lost,
                       fmt::format("sandbox {} lives on node {}, which did not take this request (node {} did): "
                                   "that node is down or cannot be reached",
                                   id, parts->node, node),
                       std::nullopt, parts->node};
    return Refusal{ServiceError::sandbox_lost,
                   fmt::format("sandbox {} was lost when serve on node {} restarted (it belonged to serve instance "
                               "{}; this one is {})",
                               id, node, parts->instance, instance),
                   std::nullopt, parts->node};
}

} // namespace agentvm
