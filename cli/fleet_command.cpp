#include <CLI/CLI.hpp>

#include "cli/fleet_command.hpp"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "service/fleet/fleet_nodes.hpp"
#include "service/fleet/haproxy_config.hpp"
#include "templates/tool.hpp"

namespace agentvm {
namespace {

struct FleetOptions {
    std::vector<std::string> node_specs;
    bool slurm = false;
    unsigned serve_port = 8080;
    bool agent_check = false;
    unsigned agent_port = 0;
    std::string bind = "0.0.0.0:8080";
    std::string stats_socket;
    std::string output;
};

// The nodes of the Slurm job this runs in: `scontrol show hostnames` expands the job's node
// list in Slurm's order, and `scontrol -o show node` gives each node's NodeAddr (its name
// when the cluster gives none; HAProxy then resolves it when it starts).
std::vector<std::pair<std::string, std::string>> slurm_nodes()
{
    const char* list = std::getenv("SLURM_JOB_NODELIST");
    if (!list || !*list)
        list = std::getenv("SLURM_NODELIST");
    if (!list || !*list)
        throw Error("--slurm: SLURM_JOB_NODELIST is not set: run this inside a Slurm job (sbatch, salloc), or "
                    "name the nodes with --node");
    const std::vector<std::string> names =
        text_lines(run_tool({"scontrol", "show", "hostnames", list}, {.what = "expanding the job's node list"}));
    if (names.empty())
        throw Error(fmt::format("--slurm: scontrol show hostnames '{}' named no node", list));
    std::vector<std::string> argv = {"scontrol", "-o", "show", "node"};
    std::string joined;
    for (const std::string& name : names)
        joined += (joined.empty() ? "" : ",") + name;
    argv.push_back(joined);
    return slurm_node_addresses(names, run_tool(argv, {.what = "reading the job's node addresses"}));
}

std::vector<FleetNode> fleet_nodes(const FleetOptions& options)
{
    if (options.serve_port == 0 || options.serve_port > 65535)
        throw Error("--serve-port must be from 1 to 65535");
    std::vector<FleetNode> nodes;
    for (const std::string& spec : options.node_specs)
        nodes.push_back(parse_node_spec(spec));
    if (options.slurm)
        for (const auto& [name, address] : slurm_nodes()) {
            FleetNode node;
            node.id = name;
            node.host = address;
            node.port = static_cast<uint16_t>(options.serve_port);
            nodes.push_back(std::move(node));
        }
    for (FleetNode& node : nodes) {
        if (options.agent_port)
            node.agent_port = static_cast<uint16_t>(options.agent_port);
        else if (options.agent_check) {
            if (node.port == 65535)
                throw Error(fmt::format("node {}: --agent-check takes serve's port + 1, and {} has none", node.id,
                                        node.port));
            node.agent_port = static_cast<uint16_t>(node.port + 1);
        }
    }
    if (const std::string problem = fleet_nodes_problem(nodes); !problem.empty()) {
        if (options.slurm && !nodes.empty())
            throw Error(fmt::format("{} (with --slurm the node ids are the Slurm node names)", problem));
        throw Error(problem);
    }
    return nodes;
}

// This command's own line, for the configuration's header: how to make it again.
std::string own_command_line()
{
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string line;
    bool first = true;
    for (size_t start = 0; start < text.size();) {
        size_t end = text.find('\0', start);
        if (end == std::string::npos)
            end = text.size();
        line += first ? std::string("agentvm") : " " + text.substr(start, end - start);
        first = false;
        start = end + 1;
    }
    return line;
}

void write_output(const std::string& path, const std::string& text)
{
    if (path.empty() || path == "-") {
        std::cout << text << std::flush;
        if (!std::cout)
            throw Error("writing to stdout failed");
        return;
    }
    // Whole or not at all: HAProxy may be reading the old one.
    const std::string temporary = path + ".tmp";
    {
        std::ofstream out(temporary, std::ios::trunc);
        out << text;
        out.close();
        if (!out)
            throw Error(fmt::format("writing {} failed", temporary));
    }
    if (std::rename(temporary.c_str(), path.c_str()) != 0)
        throw_errno(fmt::format("renaming {} to {}", temporary, path));
}

void add_node_options(CLI::App& command, FleetOptions& options)
{
    command.add_option("--node", options.node_specs,
                       "ID=HOST:PORT: a node (its serve's --node-id, and where it listens); repeatable")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    command.add_flag("--slurm", options.slurm,
                     "add the nodes of the current Slurm job (SLURM_JOB_NODELIST, scontrol): each node's id is its "
                     "Slurm name, its address Slurm's NodeAddr, its port --serve-port");
    command.add_option("--serve-port", options.serve_port, "serve's port on the --slurm nodes")
        ->capture_default_str();
    command.add_option("-o,--output", options.output, "write here (replaced whole) instead of to stdout");
}

int run_haproxy_config(const FleetOptions& options)
{
    HaproxySettings settings;
    settings.nodes = fleet_nodes(options);
    try {
        std::tie(settings.bind_host, settings.bind_port) = parse_host_port(options.bind);
    } catch (const Error& e) {
        throw Error(fmt::format("--bind: {}", e.what()));
    }
    if (!options.stats_socket.empty())
        settings.stats_socket = options.stats_socket;
    settings.made_by = own_command_line();
    write_output(options.output, haproxy_config(settings));
    return 0;
}

int run_peers(const FleetOptions& options)
{
    write_output(options.output, peers_file_text(fleet_nodes(options)));
    return 0;
}

} // namespace

std::vector<Subcommand> add_fleet_commands(CLI::App& app)
{
    auto* group = app.add_subcommand("fleet", "Many hosts behind one URL: the front door's configuration (docs/fleet.md)");
    group->require_subcommand(1);

    auto haproxy = std::make_shared<FleetOptions>();
    auto* config = group->add_subcommand(
        "haproxy-config", "Write the HAProxy 2.6 configuration of the fleet's front door: requests naming a sandbox go "
                          "to its node, the rest are balanced by free capacity");
    add_node_options(*config, *haproxy);
    config->add_flag("--agent-check", haproxy->agent_check,
                     "ask each node's serve for its capacity on serve's port + 1 (serve --agent-check)");
    config->add_option("--agent-port", haproxy->agent_port,
                       "ask each node's serve for its capacity on this port (serve --agent-check tcp:HOST:PORT)")
        ->check(CLI::Range(1, 65535));
    config->add_option("--bind", haproxy->bind, "where the front door listens, HOST:PORT ([ADDRESS]:PORT for IPv6)")
        ->capture_default_str();
    config->add_option("--stats-socket", haproxy->stats_socket,
                       "a Unix socket for HAProxy's runtime API (show stat, set server ... state drain)");

    auto peers = std::make_shared<FleetOptions>();
    auto* peers_command = group->add_subcommand(
        "peers", "Write serve's --peers-file for the fleet: ID=http://HOST:PORT a line, the same nodes as the front "
                 "door's");
    add_node_options(*peers_command, *peers);

    return {
        {config, [haproxy] { return run_haproxy_config(*haproxy); }},
        {peers_command, [peers] { return run_peers(*peers); }},
    };
}

} // namespace agentvm
