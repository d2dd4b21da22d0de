#include "service/fleet/fleet_nodes.hpp"

#include <map>
#include <set>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"
#include "service/sandbox_ids.hpp"

namespace agentvm {
namespace {

std::string_view node_line_trimmed(std::string_view text)
{
    const size_t start = text.find_first_not_of(" \t\r\n");
    if (start == std::string_view::npos)
        return {};
    const size_t end = text.find_last_not_of(" \t\r\n");
    return text.substr(start, end - start + 1);
}

// Why `host` cannot be a node's host ("" when it can). It goes into HAProxy's configuration
// and into URLs unquoted, so only the characters of names and addresses pass.
std::string host_problem(std::string_view host, bool bracketed)
{
    if (host.empty())
        return "it names no host";
    if (bracketed) {
        if (host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos)
            return "an IPv6 host is hex digits, ':' and '.' in brackets";
        return "";
    }
    if (host.size() > 253)
        return "the host name is longer than 253 characters";
    for (const char c : host)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-'
              || c == '_'))
            return "a host has only letters, digits, '.', '-' and '_' (or is an IPv6 address in brackets)";
    return "";
}

} // namespace

std::pair<std::string, uint16_t> parse_host_port(std::string_view text)
{
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || (text.starts_with('[') && text.find(']') > colon))
        throw Error(fmt::format("'{:.200}' names no port: HOST:PORT", text));
    std::string_view host = text.substr(0, colon);
    const bool bracketed = host.starts_with('[');
    if (bracketed) {
        if (!host.ends_with(']'))
            throw Error(fmt::format("'{:.200}': an IPv6 address goes in brackets, [ADDRESS]:PORT", text));
        host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string_view::npos) {
        throw Error(fmt::format("'{:.200}': an IPv6 address goes in brackets, [ADDRESS]:PORT", text));
    }
    if (const std::string problem = host_problem(host, bracketed); !problem.empty())
        throw Error(fmt::format("'{:.200}': {}", text, problem));
    const std::string_view port_text = text.substr(colon + 1);
    const std::optional<uint16_t> port = port_number(port_text);
    if (!port)
        throw Error(fmt::format("'{:.200}': the port must be a number from 1 to 65535", text));
    return {std::string(host), *port};
}

std::string host_port_text(std::string_view host, uint16_t port)
{
    if (host.find(':') != std::string_view::npos)
        return fmt::format("[{}]:{}", host, port);
    return fmt::format("{}:{}", host, port);
}

FleetNode parse_node_spec(std::string_view text)
{
    const size_t equals = text.find('=');
    if (equals == std::string_view::npos)
        throw Error(fmt::format("node '{:.200}': expected ID=HOST:PORT (n1=10.0.0.1:8080)", text));
    FleetNode node;
    node.id = std::string(text.substr(0, equals));
    if (const std::string problem = node_id_problem(node.id); !problem.empty())
        throw Error(fmt::format("node '{:.200}': '{:.64}' is not a node id: {}", text, node.id, problem));
    try {
        std::tie(node.host, node.port) = parse_host_port(text.substr(equals + 1));
    } catch (const Error& e) {
        throw Error(fmt::format("node '{:.200}': {}", text, e.what()));
    }
    return node;
}

std::vector<std::string> text_lines(std::string_view text)
{
    std::vector<std::string> lines;
    while (!text.empty()) {
        const size_t end = text.find('\n');
        const std::string_view line = node_line_trimmed(text.substr(0, end));
        if (!line.empty())
            lines.emplace_back(line);
        if (end == std::string_view::npos)
            break;
        text.remove_prefix(end + 1);
    }
    return lines;
}

std::vector<std::pair<std::string, std::string>> slurm_node_addresses(const std::vector<std::string>& names,
                                                                      std::string_view show_node_text)
{
    // One line a node with -o: "NodeName=h1 Arch=x86_64 CoresPerSocket=1 ... NodeAddr=10.0.0.1
    // NodeHostName=h1 ...": words of KEY=VALUE separated by spaces.
    std::map<std::string, std::string, std::less<>> address_of;
    for (const std::string& line : text_lines(show_node_text)) {
        std::string name;
        std::string address;
        std::string_view rest = line;
        while (!rest.empty()) {
            const size_t space = rest.find(' ');
            const std::string_view word = rest.substr(0, space);
            if (word.starts_with("NodeName="))
                name = std::string(word.substr(9));
            else if (word.starts_with("NodeAddr="))
                address = std::string(word.substr(9));
            if (space == std::string_view::npos)
                break;
            rest.remove_prefix(space + 1);
        }
        if (!name.empty() && !address.empty())
            address_of[name] = address;
    }
    std::vector<std::pair<std::string, std::string>> result;
    for (const std::string& name : names) {
        const auto found = address_of.find(name);
        result.emplace_back(name, found == address_of.end() ? name : found->second);
    }
    return result;
}

std::string fleet_nodes_problem(const std::vector<FleetNode>& nodes)
{
    if (nodes.empty())
        return "no nodes: name them with --node ID=HOST:PORT, or --slurm inside a Slurm job";
    std::set<std::string> ids;
    std::map<std::string, std::string> id_at;
    for (const FleetNode& node : nodes) {
        if (const std::string problem = node_id_problem(node.id); !problem.empty())
            return fmt::format("'{:.64}' is not a node id: {}", node.id, problem);
        if (const std::string problem = host_problem(node.host, node.host.find(':') != std::string::npos);
            !problem.empty())
            return fmt::format("node {}: host '{:.200}': {}", node.id, node.host, problem);
        if (node.port == 0)
            return fmt::format("node {}: no port", node.id);
        if (node.agent_port && (*node.agent_port == 0 || *node.agent_port == node.port))
            return fmt::format("node {}: the agent-check port {} must be a port of its own, not serve's", node.id,
                               node.agent_port.value_or(0));
        if (!ids.insert(node.id).second)
            return fmt::format("node {} is named twice", node.id);
        const std::string where = host_port_text(node.host, node.port);
        if (const auto [it, fresh] = id_at.emplace(where, node.id); !fresh)
            return fmt::format("nodes {} and {} are both {}: one serve is one node", it->second, node.id, where);
    }
    return "";
}

std::string peers_file_text(const std::vector<FleetNode>& nodes)
{
    std::string text = "# serve's --peers-file: the fleet's nodes, made by agentvm fleet (docs/fleet.md)\n";
    for (const FleetNode& node : nodes)
        text += fmt::format("{}=http://{}\n", node.id, host_port_text(node.host, node.port));
    return text;
}

} // namespace agentvm
