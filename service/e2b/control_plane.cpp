#include "service/e2b/control_plane.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.hpp"
#include "protocol/json_depth.hpp"
#include "service/create_once.hpp"
#include "service/e2b/e2b_errors.hpp"
#include "service/e2b/e2b_network.hpp"
#include "service/e2b/e2b_fleet_list.hpp"
#include "service/e2b/e2b_request.hpp"
#include "service/native/native_wire.hpp"
#include "service/problem.hpp"
#include "service/sandbox_ids.hpp"

namespace agentvm {
namespace {

constexpr std::string_view v2_sandboxes = "/v2/sandboxes";
constexpr std::string_view v1_sandboxes = "/sandboxes/";
constexpr std::string_view templates = "/templates/";
// The templateIDs the SDKs ask for when given none: serve's default pool.
constexpr std::string_view default_templates[] = {"base", "code-interpreter-v1"};

void respond_json(HttpExchange& exchange, int status, const Json& value)
{
    exchange.respond(status, json_text(value));
}

// E2B's empty success: a 204 has no body, which openapi-fetch then does not parse.
void respond_empty(HttpExchange& exchange)
{
    exchange.respond(204, "", "text/plain");
}

// A refusal from the manager: a sandbox that ended while the operation ran is one the SDK
// should read as not found ({"code": 404}), as it would had the request come a moment later.
void refuse(HttpExchange& exchange, const Refusal& refusal)
{
    if (refusal.code == ServiceError::ended)
        return exchange.refuse(ServiceError::not_found, refusal.message);
    exchange.refuse(refusal);
}

// A sandbox serve has neither running nor paused: not found, as E2B's API answers for a
// sandbox it no longer has ({"code": 404}), with a message that starts "sandbox_lost:" when
// the sandbox's node is gone or its serve restarted (docs/fleet.md).
[[noreturn]] void throw_not_found(SandboxManager& manager, const std::string& id)
{
    if (const std::optional<std::string> reason = manager.ended_reason(id))
        throw RefusedRequest(ServiceError::not_found, fmt::format("sandbox {} not found: it has ended ({})", id, *reason));
    if (auto lost = lost_sandbox(id, manager.config().node_id, manager.config().instance_id))
        throw RefusedRequest(ServiceError::not_found, fmt::format("sandbox_lost: {}", lost->message));
    throw RefusedRequest(ServiceError::not_found, fmt::format("sandbox {} not found", id));
}

// As the native API does: sandboxes made for a client that closed its connection while it
// waited, and that no repeat of the create under its Idempotency-Key waits for (`once`), would
// have no owner who knows their ids.
bool removed_if_client_closed(SandboxManager& manager, HttpExchange& exchange, const std::vector<std::string>& ids,
                              const CreateOnce& once = CreateOnce())
{
    if (once.made(exchange, ids))
        return false;
    for (const std::string& id : ids)
        if (auto sandbox = manager.find(id))
            manager.remove(*sandbox, "its creator went away before it was ready");
    return true;
}

const Json& e2b_state(const SandboxSettings& settings)
{
    static const Json none = Json::object();
    const auto it = settings.facade.find("e2b");
    return it != settings.facade.end() && it->is_object() ? *it : none;
}

int64_t unix_ms(WallTime when)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
}

bool metadata_matches(const Json& metadata, const std::map<std::string, std::string>& filter)
{
    for (const auto& [key, value] : filter) {
        const auto it = metadata.find(key);
        if (it == metadata.end() || !it->is_string() || it->get_ref<const std::string&>() != value)
            return false;
    }
    return true;
}

// The running sandbox `id`, or none (not running, or on its way out).
std::shared_ptr<Sandbox> running(SandboxManager& manager, const std::string& id)
{
    std::shared_ptr<Sandbox> sandbox = manager.find(id);
    return sandbox && !sandbox->stopping() ? sandbox : nullptr;
}

} // namespace

HttpServer::Admission E2bControlPlane::admit(HttpExchange& /*head*/)
{
    HttpServer::Admission admission;
    admission.errors = &e2b_control_errors();
    admission.handler = [this](const Exchange& exchange) { handle(exchange); };
    admission.max_body = size_t{1} << 20;
    return admission;
}

void E2bControlPlane::handle(const Exchange& exchange)
{
    try {
        // Before anything parses the body: what is done with a parsed body recurses.
        if (!json_depth_within(exchange->body()))
            throw RefusedRequest(ServiceError::bad_json,
                                 fmt::format("the body nests arrays and objects deeper than {} levels", max_json_depth));
        route(exchange);
    } catch (const RefusedRequest& e) {
        exchange->refuse(e.code, e.what());
    }
}

void E2bControlPlane::route(const Exchange& exchange)
{
    const std::string& path = exchange->path();
    if (path == v2_sandboxes) {
        if (exchange->method() == "POST")
            return create(exchange, json_body(*exchange));
        require_method(*exchange, "GET");
        return list(exchange);
    }
    if (path.starts_with(std::string(v2_sandboxes) + "/") && path.ends_with("/connect")) {
        require_method(*exchange, "POST");
        const size_t start = v2_sandboxes.size() + 1;
        return connect(exchange, path.substr(start, path.size() - start - std::string_view("/connect").size()),
                       json_body(*exchange));
    }
    if (path.starts_with(v1_sandboxes)) {
        const std::string rest = path.substr(v1_sandboxes.size());
        const size_t slash = rest.find('/');
        return sandbox_request(exchange, rest.substr(0, slash),
                               slash == std::string::npos ? "" : rest.substr(slash + 1));
    }
    if (path == "/snapshots") {
        require_method(*exchange, "GET");
        return list_snapshots(exchange);
    }
    if (path.starts_with(templates)) {
        require_method(*exchange, "DELETE");
        return delete_snapshot(exchange, path.substr(templates.size()));
    }
    throw RefusedRequest(ServiceError::not_found,
                         fmt::format("no such endpoint: {} {} (agentvm serves E2B's sandbox and snapshot calls)",
                                     exchange->method(), path));
}

void E2bControlPlane::create(const Exchange& exchange, const Json& body)
{
    E2bCreate request = parse_e2b_create(body);
    SandboxSettings settings;
    settings.timeout = request.timeout;
    settings.env = std::move(request.env);
    settings.metadata = std::move(request.metadata);
    settings.pause_on_timeout = request.auto_pause;
    settings.egress = std::move(request.egress);
    Json state{{"templateID", request.template_id}};
    std::optional<CreateOnce> once = CreateOnce::begin(
        creates_, exchange,
        [this](HttpExchange& repeat, const std::vector<std::string>& ids) { answer_made(repeat, ids.at(0)); });
    if (!once)
        return;  // a repeat: answered with what its first create makes, or made
    auto answer = [this, exchange, once = std::move(*once)](Sandbox* sandbox, const Refusal* refusal) {
        if (refusal) {
            once.refused(*refusal);
            return refuse(*exchange, *refusal);
        }
        if (!removed_if_client_closed(manager_, *exchange, {sandbox->id()}, once))
            respond_json(*exchange, 201, e2b_sandbox_json(view_of(*sandbox)));
    };

    // A kept snapshot, by its id or (the newest of that name) by a name it was given.
    const KeptSnapshot* kept = manager_.find_kept(request.template_id);
    if (!kept) {
        for (const KeptSnapshot* candidate : manager_.kept_snapshots())
            if (std::find(candidate->names.begin(), candidate->names.end(), request.template_id)
                    != candidate->names.end()
                && (!kept || candidate->created_at_ms > kept->created_at_ms))
                kept = candidate;
    }
    if (kept) {
        // The snapshot's env, under what this create gives: a template's env vars hold in
        // the sandboxes made from it.
        std::map<std::string, std::string> env = kept->settings.env;
        for (auto& [name, value] : settings.env)
            env[name] = std::move(value);
        settings.env = std::move(env);
        if (!kept->names.empty())
            state["alias"] = kept->names.front();
        settings.facade["e2b"] = std::move(state);
        return manager_.create_from_kept(kept->id, std::move(settings), std::move(answer));
    }

    std::string pool = request.template_id;
    const auto& pools = manager_.config().pools;
    const bool configured = std::any_of(pools.begin(), pools.end(), [&](const PoolConfig& p) { return p.name == pool; });
    if (!configured && std::find(std::begin(default_templates), std::end(default_templates), pool)
                           != std::end(default_templates))
        pool = manager_.default_pool();
    state["alias"] = request.template_id;
    settings.facade["e2b"] = std::move(state);
    manager_.create(pool, std::move(settings), std::move(answer));
}

void E2bControlPlane::answer_made(HttpExchange& repeat, const std::string& id)
{
    if (std::shared_ptr<Sandbox> sandbox = running(manager_, id))
        return respond_json(repeat, 201, e2b_sandbox_json(view_of(*sandbox)));
    if (const PausedSandbox* paused = manager_.find_paused(id))
        return respond_json(repeat, 201, e2b_sandbox_json(view_of(*paused)));
    // Ended: answered as a request to the sandbox would be now.
    throw_not_found(manager_, id);
}

void E2bControlPlane::connect(const Exchange& exchange, const std::string& id, const Json& body)
{
    const E2bConnect request = parse_e2b_connect(body);
    if (std::shared_ptr<Sandbox> sandbox = running(manager_, id)) {
        // Only ever lengthened: a connect asks for the sandbox to live at least this long.
        if (request.timeout
            && std::chrono::system_clock::now() + *request.timeout > sandbox->status().expires_at)
            sandbox->set_timeout(*request.timeout);
        return respond_json(*exchange, 200, e2b_sandbox_json(view_of(*sandbox)));
    }
    if (!manager_.find_paused(id))
        throw_not_found(manager_, id);
    if (!request.memory)
        throw_bad_field("\"memory\": agentvm does not do a resume from disk alone: its pauses keep the whole VM, "
                        "which a resume restores (leave it out, or true)");
    const std::chrono::seconds timeout = request.timeout.value_or(e2b_default_timeout);
    manager_.resume(id, [this, exchange, timeout](Sandbox* sandbox, const Refusal* refusal) {
        if (refusal)
            return refuse(*exchange, *refusal);
        sandbox->set_timeout(timeout);
        if (!exchange->gone())  // resumed all the same: it runs under its id
            respond_json(*exchange, 201, e2b_sandbox_json(view_of(*sandbox)));
    });
}

void E2bControlPlane::list(const Exchange& exchange)
{
    const E2bListQuery query = parse_e2b_list_query([&](const char* name) { return exchange->query(name); });
    std::vector<E2bSandboxView> views;
    if (query.running)
        for (Sandbox* sandbox : manager_.sandboxes())
            if (!sandbox->stopping())
                views.push_back(view_of(*sandbox));
    if (query.paused)
        for (const PausedSandbox* paused : manager_.paused())
            views.push_back(view_of(*paused));
    std::erase_if(views, [&](const E2bSandboxView& view) {
        return !metadata_matches(view.metadata, query.metadata)
               || (query.template_id && view.template_id != *query.template_id && view.alias != query.template_id)
               || (query.started_after && view.started_at < *query.started_after);
    });
    std::vector<PageKey> keys;
    for (const E2bSandboxView& view : views)
        keys.push_back(PageKey{unix_ms(view.started_at), view.id});
    const Page page = page_of(keys, query.ascending, query.after, query.limit);
    if (!peers_ || node_scope_only(*exchange)) {
        Json out = Json::array();
        for (size_t index : page.entries)
            out.push_back(e2b_listed_json(views[index]));
        if (page.next_token)
            exchange->add_header("X-Next-Token", *page.next_token);
        return respond_json(*exchange, 200, out);
    }
    // The fleet's page (e2b_fleet_list.hpp): this node's page and each peer's, merged.
    std::vector<E2bListed> local;
    for (size_t index : page.entries)
        local.push_back(E2bListed{keys[index], e2b_listed_json(views[index])});
    const std::string target = e2b_list_target([&](const char* name) { return exchange->query(name); });
    peers_->get_all(target, forwarded_credentials(*exchange),
                    [peers = peers_, exchange, local = std::move(local), more = page.next_token.has_value(),
                     query](std::vector<PeerAnswer> answers) mutable {
                        guard_request(*exchange, [&] {
                            std::vector<Unreached> unreached;
                            E2bFleetPage merged =
                                merge_e2b_lists(std::move(local), more, answers, query.ascending, query.limit, unreached);
                            peers->log_unreached(unreached);
                            if (!unreached.empty())
                                exchange->add_header(unreached_header, unreached_text(unreached));
                            if (merged.next_token)
                                exchange->add_header("X-Next-Token", *merged.next_token);
                            respond_json(*exchange, 200, merged.entries);
                        });
                    });
}

void E2bControlPlane::list_snapshots(const Exchange& exchange)
{
    const E2bSnapshotQuery query = parse_e2b_snapshot_query([&](const char* name) { return exchange->query(name); });
    std::vector<const KeptSnapshot*> kept = manager_.kept_snapshots();
    std::erase_if(kept, [&](const KeptSnapshot* snapshot) {
        return (query.sandbox_id && snapshot->sandbox_id != *query.sandbox_id)
               || (query.name && snapshot->id != *query.name
                   && std::find(snapshot->names.begin(), snapshot->names.end(), *query.name) == snapshot->names.end());
    });
    std::vector<PageKey> keys;
    for (const KeptSnapshot* snapshot : kept)
        keys.push_back(PageKey{snapshot->created_at_ms, snapshot->id});
    const Page page = page_of(keys, false, query.after, query.limit);
    Json out = Json::array();
    for (size_t index : page.entries)
        out.push_back(e2b_snapshot_json(kept[index]->id, kept[index]->names));
    if (page.next_token)
        exchange->add_header("X-Next-Token", *page.next_token);
    respond_json(*exchange, 200, out);
}

void E2bControlPlane::delete_snapshot(const Exchange& exchange, const std::string& id)
{
    if (!manager_.remove_kept(id))
        throw RefusedRequest(ServiceError::not_found,
                             fmt::format("snapshot {:.128} not found (agentvm deletes only the snapshots it keeps)", id));
    respond_empty(*exchange);
}

void E2bControlPlane::sandbox_request(const Exchange& exchange, const std::string& id, const std::string& action)
{
    if (std::shared_ptr<Sandbox> sandbox = running(manager_, id))
        return running_request(exchange, sandbox, action);
    if (const PausedSandbox* paused = manager_.find_paused(id))
        return paused_request(exchange, *paused, action);
    // The fork's SDK reads not-found from the HTTP status, the others from the body's code:
    // a 404 {"code": 404} says it to both.
    throw_not_found(manager_, id);
}

void E2bControlPlane::running_request(const Exchange& exchange, const std::shared_ptr<Sandbox>& sandbox,
                                      const std::string& action)
{
    const std::string& method = exchange->method();
    if (action.empty()) {
        if (method == "GET")
            return respond_json(*exchange, 200, e2b_detail_json(view_of(*sandbox)));
        require_method(*exchange, "DELETE");
        manager_.remove(*sandbox, "deleted");
        return respond_empty(*exchange);
    }
    if (action == "timeout") {
        require_method(*exchange, "POST");
        sandbox->set_timeout(parse_e2b_set_timeout(json_body(*exchange)));
        return respond_empty(*exchange);
    }
    if (action == "metrics") {
        require_method(*exchange, "GET");
        return metrics(exchange, *sandbox);
    }
    if (action == "pause") {
        require_method(*exchange, "POST");
        parse_e2b_pause(json_body(*exchange));
        // The sandbox's calls end with it, as E2B's pause cuts the connections into it.
        return manager_.pause(
            *sandbox,
            [exchange](const PausedSandbox*, const Refusal* refusal) {
                if (refusal)
                    return refuse(*exchange, *refusal);
                respond_empty(*exchange);
            },
            true);
    }
    if (action == "fork") {
        require_method(*exchange, "POST");
        return fork(exchange, *sandbox, json_body(*exchange));
    }
    if (action == "snapshots") {
        require_method(*exchange, "POST");
        std::vector<std::string> names;
        if (std::optional<std::string> name = parse_e2b_snapshot_request(json_body(*exchange)))
            names.push_back(std::move(*name));
        return manager_.keep_snapshot(*sandbox, std::move(names),
                                      [exchange](const KeptSnapshot* kept, const Refusal* refusal) {
                                          if (refusal)
                                              return refuse(*exchange, *refusal);
                                          respond_json(*exchange, 201, e2b_snapshot_json(kept->id, kept->names));
                                      });
    }
    if (action == "network") {
        require_method(*exchange, "PUT");
        const Json body = json_body(*exchange);
        E2bNetworkFields fields;
        if (body.contains("allow_internet_access")) {
            if (!body["allow_internet_access"].is_boolean())
                throw_bad_field("\"allow_internet_access\" must be true or false");
            fields.allow_internet_access = body["allow_internet_access"].get<bool>();
        }
        // updateNetwork sends the network object's fields at the top, beside allow_internet_access.
        Json network = body;
        network.erase("allow_internet_access");
        fields.network = &network;
        std::optional<EgressRules> rules = e2b_egress_rules(fields);
        try {
            manager_.change_egress(*sandbox, rules ? std::move(*rules) : EgressRules{});
        } catch (const Error& e) {
            throw RefusedRequest(ServiceError::internal, fmt::format("updating the sandbox's network: {}", e.what()));
        }
        return respond_empty(*exchange);
    }
    throw RefusedRequest(ServiceError::not_found, fmt::format("no such endpoint: {} {}", method, exchange->path()));
}

void E2bControlPlane::paused_request(const Exchange& exchange, const PausedSandbox& paused, const std::string& action)
{
    const std::string id = paused.settings.id;
    if (action.empty()) {
        if (exchange->method() == "GET")
            return respond_json(*exchange, 200, e2b_detail_json(view_of(paused)));
        require_method(*exchange, "DELETE");
        manager_.remove_paused(id, "deleted");
        return respond_empty(*exchange);
    }
    if (action == "metrics") {
        // A paused sandbox has no VM to measure.
        require_method(*exchange, "GET");
        return respond_json(*exchange, 200, Json::array());
    }
    if (action == "pause") {
        require_method(*exchange, "POST");
        throw RefusedRequest(ServiceError::paused, fmt::format("sandbox {} is already paused", id));
    }
    throw RefusedRequest(ServiceError::paused,
                         fmt::format("sandbox {} is paused: connect to it (Sandbox.connect) to resume it first", id));
}

void E2bControlPlane::fork(const Exchange& exchange, Sandbox& parent, const Json& body)
{
    const E2bFork request = parse_e2b_fork(body, max_fork_count);
    // E2B's spec gives forks 15 s when the request names no timeout; agentvm gives them a
    // create's default, long enough to be connected to and used.
    const std::chrono::seconds timeout = request.timeout.value_or(e2b_default_timeout);
    const unsigned count = request.count;
    manager_.fork(parent, count,
                  [this, exchange, timeout, count](const std::vector<Sandbox*>& children, const Refusal* refusal) {
                      Json out = Json::array();
                      if (refusal) {
                          // Forks were tried and failed to start: each entry says so. Anything
                          // refused before any fork was tried is the request's own error.
                          if (refusal->code != ServiceError::start_failed)
                              return refuse(*exchange, *refusal);
                          for (unsigned i = 0; i < count; ++i)
                              out.push_back(e2b_fork_error_json(500, refusal->message));
                          return respond_json(*exchange, 201, out);
                      }
                      std::vector<std::string> ids;
                      for (Sandbox* child : children) {
                          child->set_timeout(timeout);
                          ids.push_back(child->id());
                      }
                      if (removed_if_client_closed(manager_, *exchange, ids))
                          return;
                      for (Sandbox* child : children)
                          out.push_back(Json{{"sandbox", e2b_sandbox_json(view_of(*child))}});
                      respond_json(*exchange, 201, out);
                  });
}

void E2bControlPlane::metrics(const Exchange& exchange, const Sandbox& sandbox)
{
    // ?start= and ?end= (unix seconds) bound the readings; serve keeps no history of them, so
    // the answer is the one reading taken now, when the range holds now.
    const auto bound = [&](const char* name) -> std::optional<int64_t> {
        const std::optional<std::string> text = exchange->query(name);
        if (!text || text->empty())
            return std::nullopt;
        if (text->size() > 12 || text->find_first_not_of("0123456789") != std::string::npos)
            throw_bad_field(fmt::format("\"{}\" must be a time in unix seconds", name));
        return std::stoll(*text);
    };
    const std::optional<int64_t> start = bound("start"), end = bound("end");
    const WallTime now = std::chrono::system_clock::now();
    const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    if ((start && *start > now_s) || (end && *end < now_s))
        return respond_json(*exchange, 200, Json::array());
    const VmShape& shape = shape_of(sandbox.pool());
    const VmUsage usage = measure_vm(sandbox.pid(), shape.disk_bytes);
    E2bMetric metric;
    metric.at = now;
    // Host CPU time of the VM's processes (its vCPU threads and the VMM's own work) since the
    // previous reading, as a share of its vCPUs.
    metric.cpu_used_pct =
        cpu_.percent(sandbox.id(), usage.cpu_seconds, shape.vcpus, sandbox.started(), CpuMeter::Clock::now());
    metric.cpu_count = shape.vcpus;
    // Resident memory of the VM's processes: the guest pages it has touched, and the VMM's
    // own; the guest's page cache is not visible from the host, so memCache is 0.
    metric.mem_used = usage.rss_bytes;
    metric.mem_total = shape.mem_mib << 20;
    metric.mem_cache = 0;
    // What the disk's copy-on-write overlay stores: the sectors the guest wrote since its
    // snapshot (0 when serve may not read the VMM's files), of the disk's size.
    metric.disk_used = usage.disk_used;
    metric.disk_total = shape.disk_bytes;
    respond_json(*exchange, 200, Json::array({e2b_metric_json(metric)}));
}

E2bSandboxView E2bControlPlane::view_of(const Sandbox& sandbox)
{
    const Sandbox::Status status = sandbox.status();
    const SandboxSettings& settings = sandbox.settings();
    const Json& state = e2b_state(settings);
    E2bSandboxView view;
    view.domain = manager_.config().e2b_domain;
    view.id = settings.id;
    view.template_id = state.value("templateID", sandbox.pool());
    if (state.contains("alias") && state["alias"].is_string())
        view.alias = state["alias"].get<std::string>();
    view.envd_token = tokens_.envd_token(view.id);
    view.traffic_token = tokens_.traffic_token(view.id);
    view.started_at = status.created_at;
    view.end_at = status.expires_at;
    view.metadata = settings.metadata;
    view.pause_on_timeout = settings.pause_on_timeout;
    view.egress = settings.egress ? settings.egress : default_egress(sandbox.pool());
    const VmShape& shape = shape_of(sandbox.pool());
    view.cpu_count = shape.vcpus;
    view.memory_mb = shape.mem_mib;
    view.disk_mb = shape.disk_bytes >> 20;
    return view;
}

std::optional<EgressRules> E2bControlPlane::default_egress(const std::string& pool) const
{
    const EgressRules& rules = manager_.default_egress(pool);
    return rules.allow.empty() ? std::nullopt : std::optional<EgressRules>(rules);
}

E2bSandboxView E2bControlPlane::view_of(const PausedSandbox& paused)
{
    const Json& state = e2b_state(paused.settings);
    E2bSandboxView view;
    view.domain = manager_.config().e2b_domain;
    view.id = paused.settings.id;
    view.template_id = state.value("templateID", paused.pool);
    if (state.contains("alias") && state["alias"].is_string())
        view.alias = state["alias"].get<std::string>();
    view.envd_token = tokens_.envd_token(view.id);
    view.traffic_token = tokens_.traffic_token(view.id);
    view.paused = true;
    // While paused: since when, and until when serve keeps it (--paused-retention).
    view.started_at = WallTime(std::chrono::seconds(paused.paused_at));
    view.end_at = WallTime(std::chrono::seconds(paused.retain_until));
    view.metadata = paused.settings.metadata;
    view.pause_on_timeout = paused.settings.pause_on_timeout;
    view.egress = paused.settings.egress ? paused.settings.egress : default_egress(paused.pool);
    const VmShape& shape = shape_of(paused.pool);
    view.cpu_count = shape.vcpus;
    view.memory_mb = shape.mem_mib;
    view.disk_mb = shape.disk_bytes >> 20;
    return view;
}

const VmShape& E2bControlPlane::shape_of(const std::string& pool)
{
    if (auto it = shapes_.find(pool); it != shapes_.end())
        return it->second;
    VmShape shape;  // all 0: a pool serve does not know, or whose VMs boot cold
    for (const PoolConfig& config : manager_.config().pools)
        if (config.name == pool)
            shape = pool_vm_shape(config, manager_.config().program).value_or(VmShape{});
    return shapes_.emplace(pool, shape).first->second;
}

} // namespace agentvm
