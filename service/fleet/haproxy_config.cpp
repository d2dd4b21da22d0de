#include "service/fleet/haproxy_config.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "service/sandbox_ids.hpp"

// Every HAProxy mechanism used here was checked against HAProxy 2.6.12 (Debian 12) by
// tests/service/fleet_routing_check.py and by hand; docs/fleet.md says what each one does for
// the fleet. The ones whose behaviour is not obvious from their names:
//
// - `use-server %[var(txn.node)]`: a log-format server name. When that server is down, or no
//   server has that name, HAProxy ignores the rule and balances the request instead; the node
//   that gets it answers sandbox_lost naming the id's node.
// - The routed backends check only that serve accepts connections (an L4 check), apart from
//   the balanced ones: an agent's "maint" (a node that cannot start VMs) or a 503 /healthz
//   (draining) must not move a live sandbox's requests to another node, and HAProxy passes
//   MAINT on to every server that `track`s the one in maintenance.
// - A weight set by the agent is not passed on by `track`: every balanced backend asks the
//   agent itself (`track` for up/down and the agent for the weight work on one server).
// - An agent's "0%" (no room) leaves a server up with weight 0, which HAProxy never picks; when
//   every node is at 0%, a balanced backend's `backup` twins (weight 100, tracking the node's
//   state) take the request, so that a node answers it (503 + Agentvm-Refusal: at_capacity,
//   then 429 after the retries) instead of HAProxy's own 503.
// - `retry-on 503` retries on another node (`option redispatch 1`) only what fits in one
//   buffer (tune.bufsize, 16 KiB by default); `http-response` rules see the last answer only.

namespace agentvm {
namespace {

// A sandbox id as service/sandbox_ids.hpp makes it: "<node>-<6 hex>-<16 hex>".
const std::string sandbox_id_pattern =
    fmt::format("[a-z0-9-]{{1,{}}}-[0-9a-f]{{{}}}-[0-9a-f]{{{}}}", max_node_id, instance_hex, random_hex);

constexpr const char* check_timing = "inter 1s fastinter 250ms downinter 1s fall 2 rise 2";

// The APIs whose error shapes the front door's own answers take.
enum class Api { native, e2b, fusion };

// A JSON body for HAProxy's http-error lf-string, in the configuration's quoting: every '"'
// escaped. `message` may hold log-format expressions (%[...]) but no '"' or '\'.
std::string error_body(Api api, int status, const std::string& code, const std::string& message,
                       const std::string& node_expression)
{
    std::string json;
    switch (api) {
    case Api::native:
        json = fmt::format(R"({{"error":"{}","message":"{}: {}")", code, code, message);
        if (!node_expression.empty())
            json += fmt::format(R"(,"node":"{}")", node_expression);
        json += "}";
        break;
    case Api::e2b:
        json = fmt::format(R"({{"code":{},"message":"{}: {}"}})", status, code, message);
        break;
    case Api::fusion:
        json = fmt::format(R"({{"status":"SandboxError","message":"{}: {}","compile_result":null,)"
                           R"("run_result":null,"executor_pod_name":null,"files":{{}}}})",
                           code, message);
        break;
    }
    std::string quoted;
    for (const char c : json) {
        if (c == '"')
            quoted += '\\';
        quoted += c;
    }
    return quoted;
}

std::string http_error(Api api, int status, const std::string& code, const std::string& message,
                       const std::string& node_expression, const std::string& extra = "")
{
    return fmt::format("    http-error status {} content-type application/json lf-string \"{}\"{}\n", status,
                       error_body(api, status, code, message, node_expression), extra);
}

// The front door's own answers for a request that names a sandbox: its node is gone (502: the
// connection closed under the request; 503: no node is up at all) or silent for an hour.
std::string routed_errors(Api api)
{
    const std::string node = "%[var(txn.node)]";
    const std::string sandbox = "%[var(txn.sandbox)]";
    return http_error(api, 502, "sandbox_lost",
                      fmt::format("node {} went away before it answered for sandbox {} (its serve died or "
                                  "restarted; the front door answers)",
                                  node, sandbox),
                      node)
           + http_error(api, 503, "sandbox_lost",
                        fmt::format("node {} of sandbox {} cannot be reached, and no other node is up (the front "
                                    "door answers)",
                                    node, sandbox),
                        node)
           + http_error(api, 504, "sandbox_lost",
                        fmt::format("node {} did not answer for sandbox {} within the front door's timeout server "
                                    "(1 h)",
                                    node, sandbox),
                        node);
}

// The same for balanced requests: the node that took one went away under it, or none can take it.
std::string balanced_errors(Api api)
{
    // The server's name without a backup twin's "_full".
    const std::string node = "%[srv_name,field(1,_)]";
    return http_error(api, 502, "sandbox_lost",
                      fmt::format("node {} went away before it answered (its serve died or restarted; the front "
                                  "door answers)",
                                  node),
                      node)
           + http_error(api, 503, "unavailable",
                        "no node of the fleet can take this request now: every node is down, draining or in "
                        "maintenance (the front door answers)",
                        "", " hdr Retry-After 5")
           + http_error(api, 504, "sandbox_lost",
                        fmt::format("node {} did not answer within the front door's timeout server (1 h)", node),
                        node);
}

std::string node_address(const FleetNode& node)
{
    return host_port_text(node.host, node.port);
}

std::string agent_options(const FleetNode& node)
{
    if (!node.agent_port)
        return "";
    return fmt::format(" agent-check agent-port {} agent-inter 1s", *node.agent_port);
}

bool any_agent(const std::vector<FleetNode>& nodes)
{
    for (const FleetNode& node : nodes)
        if (node.agent_port)
            return true;
    return false;
}

// What every balanced backend does: retry a request a node refused for room (its 503 with
// Agentvm-Refusal) or could not be connected to on another node, and answer 429 again when the
// last node tried was full.
std::string retry_rules()
{
    return "    option http-buffer-request\n"
           "    retry-on conn-failure 503\n"
           "    retries 3\n"
           "    option redispatch 1\n"
           "    http-response set-status 429 if { status 503 } { res.hdr(Agentvm-Refusal) -m str at_capacity }\n";
}

// The backup twins of a balanced backend's servers, used only while every node's agent says
// "0%": then a node answers (at_capacity), not HAProxy (503 unavailable).
std::string backup_twins(const std::vector<FleetNode>& nodes)
{
    std::string text;
    if (!any_agent(nodes))
        return text;
    text += "    option allbackups\n";
    for (const FleetNode& node : nodes)
        text += fmt::format("    server {}_full {} backup track balanced_native/{} weight 100\n", node.id,
                            node_address(node), node.id);
    return text;
}

std::string global_and_defaults(const HaproxySettings& settings)
{
    std::string text = "global\n"
                       "    log stdout format raw local0 info\n";
    if (settings.stats_socket)
        text += fmt::format("    stats socket {} mode 600 level admin\n", *settings.stats_socket);
    text += R"(
defaults
    mode http
    log global
    option httplog
    option dontlognull
    timeout connect 2s
    # Long: E2B's Connect streams, long exec calls and /run_code wait on the server in silence.
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-request 10s
    timeout http-keep-alive 60s
    timeout queue 10s
    timeout check 1s
)";
    return text;
}

std::string frontend(const HaproxySettings& settings)
{
    const std::string& id = sandbox_id_pattern;
    std::string text = fmt::format(R"(
frontend agentvm
    bind {}
    # The sandbox a request names, and its node: the id's part before "-<6 hex>-<16 hex>".
    # E2B's sandbox traffic names it in E2b-Sandbox-Id (serve answers any request with that
    # header as E2B's, whatever its path); the native API and E2B's control plane in the path.
    acl e2b_traffic req.hdr(E2b-Sandbox-Id) -m found
    acl id_in_header req.hdr(E2b-Sandbox-Id) -m reg ^{}$
    acl id_in_path path_reg ^/(v1/|v2/)?sandboxes/{}(/|$)
    acl versioned_path path_beg /v1/ /v2/
    http-request set-var(txn.sandbox) req.hdr(E2b-Sandbox-Id) if id_in_header
    http-request set-var(txn.sandbox) path,field(4,/) if !e2b_traffic id_in_path versioned_path
    http-request set-var(txn.sandbox) path,field(3,/) if !e2b_traffic id_in_path !versioned_path
    http-request set-var(txn.node) var(txn.sandbox),field(-3,-,0) if {{ var(txn.sandbox) -m found }}
    acl routed var(txn.node) -m found
    # What serve's E2B facade, SandboxFusion's endpoints and creates are (service/e2b/e2b_api.cpp).
    acl e2b_path path /v2/sandboxes /snapshots
    acl e2b_path path_beg /v2/sandboxes/ /sandboxes/ /templates/
    acl files_path path /files
    acl signed urlp(signature) -m found
    acl fusion_path path /run_code /run_jupyter
    acl post method POST
    acl native_create path /v1/sandboxes
    acl e2b_create path /v2/sandboxes
    acl keyed req.hdr(Idempotency-Key) -m found
    # Balanced requests are marked, whatever the client sent, so that serve answers a create it
    # has no room for 503 + Agentvm-Refusal, which the balanced backends retry on another node.
    http-request del-header Agentvm-Front-Door
    http-request set-header Agentvm-Front-Door 1 if !routed
    use_backend sandbox_e2b if routed e2b_traffic || routed e2b_path
    use_backend sandbox_native if routed
    use_backend by_key_native if post native_create keyed
    use_backend by_key_e2b if post e2b_create keyed
    use_backend balanced_fusion if fusion_path
    use_backend balanced_e2b if e2b_traffic || e2b_path || files_path signed
    default_backend balanced_native
)",
                                   host_port_text(settings.bind_host, settings.bind_port), id, id);
    return text;
}

std::string routed_backends(const std::vector<FleetNode>& nodes)
{
    std::string text = R"(
# Requests naming a sandbox go to the id's node. When that node is down (or no node has its
# name), HAProxy ignores use-server and balances the request: the node that gets it answers
# sandbox_lost. An L4 check only (serve accepts connections): a draining or full node keeps its
# sandboxes' requests. A connection refused is retried on another node at once, which answers
# sandbox_lost; nothing else is retried (a call may have run).
backend sandbox_native
    balance random
    retry-on conn-failure
    retries 2
    option redispatch 1
    use-server %[var(txn.node)] if { var(txn.node) -m found }
)";
    text += routed_errors(Api::native);
    for (const FleetNode& node : nodes)
        text += fmt::format("    server {} {} check {}\n", node.id, node_address(node), check_timing);
    text += R"(
backend sandbox_e2b
    balance random
    retry-on conn-failure
    retries 2
    option redispatch 1
    use-server %[var(txn.node)] if { var(txn.node) -m found }
)";
    text += routed_errors(Api::e2b);
    for (const FleetNode& node : nodes)
        text += fmt::format("    server {} {} track sandbox_native/{}\n", node.id, node_address(node), node.id);
    return text;
}

std::string balanced_backends(const std::vector<FleetNode>& nodes)
{
    std::string text = R"(
# Everything that names no sandbox: creates, lists (any node answers for the whole fleet),
# /healthz, and whatever else. Power of two random choices over the nodes' weights, which each
# node's agent sets from its free capacity ("ready up N%", "drain", "maint"). /healthz answers
# 503 while serve drains or cannot start VMs: the node takes no new work.
backend balanced_native
    balance random(2)
    option httpchk
.if defined(AGENTVM_TOKEN)
    http-check send meth GET uri /healthz hdr Authorization "Bearer ${AGENTVM_TOKEN}"
.else
    http-check send meth GET uri /healthz
.endif
    http-check expect status 200
)";
    text += retry_rules();
    text += balanced_errors(Api::native);
    for (const FleetNode& node : nodes)
        text += fmt::format("    server {} {} check {} weight 100{}\n", node.id, node_address(node), check_timing,
                            agent_options(node));
    text += backup_twins(nodes);

    const auto tracking = [&nodes](const char* name, const char* comment, Api api) {
        std::string backend = fmt::format("\n{}backend {}\n    balance random(2)\n", comment, name);
        backend += retry_rules();
        backend += balanced_errors(api);
        for (const FleetNode& node : nodes)
            backend += fmt::format("    server {} {} track balanced_native/{} weight 100{}\n", node.id,
                                   node_address(node), node.id, agent_options(node));
        backend += backup_twins(nodes);
        return backend;
    };
    text += tracking("balanced_e2b",
                     "# E2B's control plane (creates, Sandbox.list, snapshots, templates), as balanced_native but\n"
                     "# with E2B's error shape. Up/down from balanced_native, the weight from the agent.\n",
                     Api::e2b);
    text += tracking("balanced_fusion",
                     "# SandboxFusion's /run_code and /run_jupyter: a sandbox for one request, anywhere. A node\n"
                     "# lost under a run is answered in SandboxFusion's shape (status SandboxError).\n",
                     Api::fusion);

    const auto by_key = [&nodes](const char* name, Api api) {
        std::string backend = fmt::format(R"(
# Creates with an Idempotency-Key ({} API): one key, one node, so that a repeat finds what the
# first made (serve keeps keys per node). Consistent hashing over fixed weights: a key moves
# only when the set of up nodes changes (no agent weights, no bounded load, which would move
# keys as capacity changes). A full node's refusal is retried on the next node of the ring.
backend {}
    balance hdr(Idempotency-Key)
    hash-type consistent
)",
                                          api == Api::native ? "native" : "E2B", name);
        backend += retry_rules();
        backend += balanced_errors(api);
        for (const FleetNode& node : nodes)
            backend += fmt::format("    server {} {} track balanced_native/{} weight 100\n", node.id,
                                   node_address(node), node.id);
        return backend;
    };
    text += by_key("by_key_native", Api::native);
    text += by_key("by_key_e2b", Api::e2b);
    return text;
}

std::string bind_host_problem(const std::string& host)
{
    if (host.empty())
        return "the bind address names no host";
    if (host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:")
        != std::string::npos)
        return fmt::format("the bind address '{:.200}' is not a host name or IP address", host);
    return "";
}

} // namespace

std::string stats_socket_problem(const std::string& path)
{
    if (path.empty() || path.front() != '/')
        return fmt::format("the stats socket '{:.200}' must be an absolute path", path);
    if (path.find_first_of(" \t\r\n\"'#\\") != std::string::npos)
        return fmt::format("the stats socket '{:.200}' has whitespace, a quote, '#' or '\\'", path);
    return "";
}

std::string haproxy_config(const HaproxySettings& settings)
{
    if (const std::string problem = fleet_nodes_problem(settings.nodes); !problem.empty())
        throw Error(problem);
    if (const std::string problem = bind_host_problem(settings.bind_host); !problem.empty())
        throw Error(problem);
    if (settings.bind_port == 0)
        throw Error("the bind port must be from 1 to 65535");
    if (settings.stats_socket)
        if (const std::string problem = stats_socket_problem(*settings.stats_socket); !problem.empty())
            throw Error(problem);

    std::string text = "# HAProxy 2.6 configuration of an agentvm fleet's front door (docs/fleet.md).\n";
    if (!settings.made_by.empty()) {
        std::string made_by = settings.made_by;
        for (char& c : made_by)
            if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
                c = ' ';  // one comment line, whatever the command line held
        text += fmt::format("# Made by: {}\n", made_by);
    }
    text += "# Nodes (the server names are the nodes' ids, the first part of every sandbox id):\n";
    for (const FleetNode& node : settings.nodes)
        text += fmt::format("#   {} at {}{}\n", node.id, node_address(node),
                            node.agent_port ? fmt::format(", agent check on port {}", *node.agent_port)
                                            : std::string(", no agent check"));
    text += "# With a token (serve --token-file), start HAProxy with AGENTVM_TOKEN set to it: the health\n"
            "# checks of /healthz carry it.\n";
    text += global_and_defaults(settings);
    text += frontend(settings);
    text += routed_backends(settings.nodes);
    text += balanced_backends(settings.nodes);
    return text;
}

} // namespace agentvm
