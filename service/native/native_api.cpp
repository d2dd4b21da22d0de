#include "service/native/native_api.hpp"

#include <fmt/format.h>

#include "protocol/json_depth.hpp"
#include "protocol/utf8.hpp"
#include "service/call_relay.hpp"
#include "service/client_auth.hpp"
#include "service/create_once.hpp"
#include "service/create_request.hpp"
#include "service/file_transfer.hpp"
#include "service/native/agent_ops.hpp"
#include "service/native/native_wire.hpp"
#include "service/problem.hpp"
#include "service/sandbox_ids.hpp"

namespace agentvm {
namespace {

constexpr std::string_view sandboxes_prefix = "/v1/sandboxes";

void require_method(const HttpExchange& exchange, const char* method)
{
    if (exchange.method() != method)
        throw RefusedRequest(ServiceError::method_not_allowed, fmt::format("{} takes {}", exchange.path(), method));
}

Json json_body(const HttpExchange& exchange)
{
    Json body = Json::parse(exchange.body(), nullptr, false);
    if (!body.is_object())
        throw RefusedRequest(ServiceError::bad_json, "the body must be a JSON object");
    return body;
}

// Deletes the sandboxes `ids` (a create's, a fork's) when their client closed its connection
// while it waited for them, and no repeat of the create under its Idempotency-Key waits for
// them (`once`): nobody else would learn their ids. True when it did (the answer is then not
// sent). Asked of the socket at the moment of answering: an answer that was sent whole and
// then read by a client that closed at once is delivered, whatever the HTTP library reports
// of the connection's end afterwards.
bool removed_if_client_closed(SandboxManager& manager, HttpExchange& exchange, const std::vector<std::string>& ids,
                              const CreateOnce& once)
{
    if (once.made(exchange, ids))
        return false;
    for (const std::string& id : ids)
        if (auto sandbox = manager.find(id))
            manager.remove(*sandbox, "its creator went away before it was ready");
    return true;
}

// What a history entry keeps of a request's argv or cmd: strings clipped to 1 KiB, arrays to
// 64 entries, so a huge command line costs the history little.
Json clipped(const Json& value)
{
    constexpr size_t max_string = 1024;
    constexpr size_t max_items = 64;
    if (value.is_string() && value.get_ref<const std::string&>().size() > max_string)
        return value.get_ref<const std::string&>().substr(0, max_string) + "…";
    if (value.is_array()) {
        Json out = Json::array();
        for (size_t i = 0; i < value.size() && i < max_items; ++i)
            out.push_back(clipped(value[i]));
        if (value.size() > max_items)
            out.push_back("…");
        return out;
    }
    return value;
}

// The file a files request names (?path=). UTF-8 only: the agent protocol carries a path as a
// JSON string, where other bytes would become U+FFFD, another file.
std::string file_path(const HttpExchange& exchange)
{
    std::optional<std::string> file = exchange.query("path");
    if (!file || file->empty())
        throw RefusedRequest(ServiceError::missing_field, "the file is named by the query argument ?path=");
    if (!is_valid_utf8(*file))
        throw RefusedRequest(ServiceError::bad_field, "?path= must be UTF-8 once percent-decoded");
    return std::move(*file);
}

// "42" -> 42: digits only, not 0, not past what a uint64_t holds.
std::optional<uint64_t> positive_integer(const std::string& text)
{
    if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    const uint64_t value = std::stoull(text);
    return value == 0 ? std::nullopt : std::optional<uint64_t>(value);
}

// "/v1/sandboxes/ID/ports/..." or ".../tcp/...": a request for a guest's port.
bool port_path(const std::string& path)
{
    if (!path.starts_with(std::string(sandboxes_prefix) + "/"))
        return false;
    const size_t id_end = path.find('/', sandboxes_prefix.size() + 1);
    if (id_end == std::string::npos)
        return false;
    const std::string_view action = std::string_view(path).substr(id_end + 1);
    return action.starts_with("ports/") || action.starts_with("tcp/");
}

// What the guest's server is asked for: the client's target as sent (still percent-encoded,
// with its query) less its first `segments` path segments, "/v1/sandboxes/ID/ports/P".
std::string target_after(const std::string& target, size_t segments)
{
    const size_t query = target.find('?');
    size_t at = 0;
    for (size_t i = 0; i < segments; ++i) {
        at = target.find('/', at + 1);
        if (at == std::string::npos || (query != std::string::npos && at > query))
            return "/" + (query == std::string::npos ? std::string() : target.substr(query));
    }
    return target.substr(at);
}

// ".../sandboxes/ID/ACTION" -> {ID, ACTION}; ACTION is empty for the sandbox itself.
std::pair<std::string, std::string> split_sandbox_path(std::string_view rest)
{
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos)
        return {std::string(rest), ""};
    return {std::string(rest.substr(0, slash)), std::string(rest.substr(slash + 1))};
}

} // namespace

bool NativeApi::takes(const HttpExchange& /*head*/) const
{
    return true;
}

HttpServer::Admission NativeApi::admit(HttpExchange& head)
{
    HttpServer::Admission admission;
    admission.errors = &native_errors();
    admission.handler = [this](const std::shared_ptr<HttpExchange>& exchange) { handle(exchange); };
    // File uploads stream: their size is bounded by the guest's disk, not by a buffer here;
    // so do requests to a guest's port, whatever their size, on to the guest.
    admission.streams_body =
        (head.method() == "PUT" && head.path().starts_with(sandboxes_prefix) && head.path().ends_with("/files"))
        || port_path(head.path());
    admission.refusal = client_refusal(head, token_);
    return admission;
}

void NativeApi::handle(const std::shared_ptr<HttpExchange>& exchange)
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

void NativeApi::route(const std::shared_ptr<HttpExchange>& exchange)
{
    const std::string& path = exchange->path();
    if (path == "/healthz") {
        require_method(*exchange, "GET");
        // The fleet's view of this node (service/fleet/capacity_report.hpp): 503 unless ok.
        const CapacityReport report = capacity_report(manager_.capacity_inputs());
        return exchange->respond(report.http_status(), report.json().dump() + "\n");
    }
    if (path == "/metrics") {
        require_method(*exchange, "GET");
        return exchange->respond(200, manager_.metrics_text(), "text/plain; version=0.0.4");
    }
    if (path == sandboxes_prefix) {
        if (exchange->method() == "POST")
            return create(exchange);
        require_method(*exchange, "GET");
        return list(exchange);
    }
    if (path.starts_with(std::string(sandboxes_prefix) + "/")) {
        auto [id, action] = split_sandbox_path(std::string_view(path).substr(sandboxes_prefix.size() + 1));
        return sandbox_request(exchange, id, action);
    }
    throw RefusedRequest(ServiceError::not_found, fmt::format("no such endpoint: {} {}", exchange->method(), path));
}

void NativeApi::list(const std::shared_ptr<HttpExchange>& exchange)
{
    Json local = Json::array();
    for (const auto& sandbox : manager_.sandboxes())
        local.push_back(sandbox_json(*sandbox));
    for (const PausedSandbox* paused : manager_.paused())
        local.push_back(paused_json(*paused));
    if (!peers_ || node_scope_only(*exchange))
        return exchange->respond(200, json_text(Json{{"sandboxes", std::move(local)}}));
    peers_->get_all(std::string(sandboxes_prefix), forwarded_credentials(*exchange),
                    [peers = peers_, exchange, local = std::move(local)](std::vector<PeerAnswer> answers) mutable {
                        guard_request(*exchange, [&] {
                            std::vector<Unreached> unreached;
                            Json merged = merge_native_lists(std::move(local), answers, unreached);
                            peers->log_unreached(unreached);
                            if (!unreached.empty())
                                exchange->add_header(unreached_header, unreached_text(unreached));
                            exchange->respond(200, json_text(merged));
                        });
                    });
}

void NativeApi::create(const std::shared_ptr<HttpExchange>& exchange)
{
    CreateRequest request = parse_create_request(exchange->body());
    const std::string pool = request.pool.empty() ? manager_.default_pool() : request.pool;
    std::optional<CreateOnce> once = CreateOnce::begin(
        creates_, exchange, [this](HttpExchange& repeat, const std::vector<std::string>& ids) {
            answer_made(repeat, ids, false);
        });
    if (!once)
        return;  // a repeat: answered with what its first create makes, or made
    manager_.create(pool, std::move(request.settings),
                    [this, exchange, once = std::move(*once)](Sandbox* sandbox, const Refusal* refusal) {
                        if (refusal) {
                            once.refused(*refusal);
                            return exchange->refuse(*refusal);
                        }
                        if (!removed_if_client_closed(manager_, *exchange, {sandbox->id()}, once))
                            exchange->respond(201, json_text(sandbox_json(*sandbox)));
                    });
}

void NativeApi::answer_made(HttpExchange& repeat, const std::vector<std::string>& ids, bool fork)
{
    Json list = Json::array();
    for (const std::string& id : ids) {
        if (std::shared_ptr<Sandbox> sandbox = manager_.find(id)) {
            list.push_back(sandbox_json(*sandbox));
            continue;
        }
        if (const PausedSandbox* paused = manager_.find_paused(id)) {
            list.push_back(paused_json(*paused));
            continue;
        }
        // Ended: a create's repeat is answered as a GET of its sandbox would be; a fork's lists
        // the child that ended, beside those that did not.
        const std::optional<std::string> reason = manager_.ended_reason(id);
        if (!fork)
            throw RefusedRequest(ServiceError::not_found,
                                 fmt::format("sandbox {} (made by the create with this Idempotency-Key) has ended ({})",
                                             id, reason.value_or("its reason is no longer remembered")));
        list.push_back(Json{{"id", id}, {"state", "ended"}, {"reason", reason ? Json(*reason) : Json(nullptr)}});
    }
    if (!fork)
        return repeat.respond(201, json_text(list.at(0)));
    repeat.respond(201, json_text(Json{{"sandboxes", std::move(list)}}));
}

void NativeApi::sandbox_request(const std::shared_ptr<HttpExchange>& exchange, const std::string& id,
                                 const std::string& action)
{
    // Checked first: a request serve cannot carry out is refused whether or not its sandbox runs.
    std::optional<std::string> file;
    if (action == "files" || action == "files/stat" || action == "files/list")
        file = file_path(*exchange);
    std::shared_ptr<Sandbox> sandbox = manager_.find(id);
    if (!sandbox && manager_.find_paused(id))
        return paused_request(exchange, id, action);
    if (!sandbox) {
        if (auto reason = manager_.ended_reason(id))
            throw RefusedRequest(ServiceError::not_found, fmt::format("sandbox {} has ended ({})", id, *reason));
        if (auto lost = lost_sandbox(id, manager_.config().node_id, manager_.config().instance_id))
            return exchange->refuse(*lost);
        throw RefusedRequest(ServiceError::not_found, fmt::format("no sandbox {}", id));
    }
    const std::string& method = exchange->method();
    if (action.empty()) {
        if (method == "GET")
            return exchange->respond(200, json_text(sandbox_json(*sandbox)));
        require_method(*exchange, "DELETE");
        Json answer = sandbox_json(*sandbox);
        answer["state"] = "deleted";
        answer["history"] = sandbox->history().to_json();
        manager_.remove(*sandbox, "deleted");
        return exchange->respond(200, json_text(answer));
    }
    if (action == "exec" || action == "shell" || action == "run_code") {
        require_method(*exchange, "POST");
        return call(exchange, sandbox, action, false);
    }
    if (const std::optional<AgentOp> op = forwarded_agent_op(action)) {
        require_method(*exchange, "POST");
        return call(exchange, sandbox, action, op->follows);
    }
    if (action.starts_with("calls/")) {
        require_method(*exchange, "DELETE");
        return cancel(exchange, sandbox, action.substr(6));
    }
    if (action == "files/stat" || action == "files/list") {
        require_method(*exchange, "GET");
        return file_info(exchange, sandbox, action == "files/stat" ? "stat" : "list_dir", *file);
    }
    if (action == "files") {
        if (method == "PUT")
            return start_upload(sandbox, exchange, *file, exchange->query("mode"));
        require_method(*exchange, "GET");
        return start_download(sandbox, exchange, *file);
    }
    if (action.starts_with("ports/") || action.starts_with("tcp/"))
        return port_request(exchange, *sandbox, action);
    if (action == "timeout") {
        require_method(*exchange, "POST");
        const Json body = json_body(*exchange);
        if (!body.contains("timeout") || body.size() != 1)
            throw RefusedRequest(ServiceError::bad_field, "the body is {\"timeout\": SECONDS}");
        sandbox->set_timeout(sandbox_seconds(body["timeout"], "timeout"));
        return exchange->respond(200, json_text(sandbox_json(*sandbox)));
    }
    if (action == "history") {
        require_method(*exchange, "GET");
        return exchange->respond(200, json_text(sandbox->history().to_json()));
    }
    if (action == "fork") {
        require_method(*exchange, "POST");
        const Json body = exchange->body().empty() ? Json::object() : json_body(*exchange);
        const Json count = body.value("count", Json(1));
        if (body.size() > (body.contains("count") ? 1u : 0u) || !count.is_number_unsigned() || count.get<uint64_t>() == 0 ||
            count.get<uint64_t>() > max_fork_count)
            throw RefusedRequest(ServiceError::bad_field, fmt::format("the body is {{\"count\": N}}, N from 1 to {}", max_fork_count));
        // A fork makes sandboxes as a create does, and is the slowest create (a live
        // snapshot): the likeliest to be retried after a client's timeout.
        std::optional<CreateOnce> once = CreateOnce::begin(
            creates_, exchange, [this](HttpExchange& repeat, const std::vector<std::string>& ids) {
                answer_made(repeat, ids, true);
            });
        if (!once)
            return;
        return manager_.fork(*sandbox, count.get<unsigned>(),
                             [this, exchange, once = std::move(*once)](const std::vector<Sandbox*>& children,
                                                                     const Refusal* refusal) {
                                 if (refusal) {
                                     once.refused(*refusal);
                                     return exchange->refuse(*refusal);
                                 }
                                 std::vector<std::string> ids;
                                 for (Sandbox* child : children)
                                     ids.push_back(child->id());
                                 if (removed_if_client_closed(manager_, *exchange, ids, once))
                                     return;
                                 Json list = Json::array();
                                 for (Sandbox* child : children)
                                     list.push_back(sandbox_json(*child));
                                 exchange->respond(201, json_text(Json{{"sandboxes", std::move(list)}}));
                             });
    }
    if (action == "pause") {
        require_method(*exchange, "POST");
        return manager_.pause(*sandbox, [exchange](const PausedSandbox* paused, const Refusal* refusal) {
            if (refusal)
                return exchange->refuse(*refusal);
            exchange->respond(200, json_text(paused_json(*paused)));
        });
    }
    if (action == "resume")
        throw RefusedRequest(ServiceError::not_paused, fmt::format("sandbox {} is running, not paused", id));
    throw RefusedRequest(ServiceError::not_found, fmt::format("no such endpoint: {} {}", method, exchange->path()));
}

void NativeApi::paused_request(const std::shared_ptr<HttpExchange>& exchange, const std::string& id,
                                const std::string& action)
{
    const PausedSandbox& paused = *manager_.find_paused(id);
    if (action.empty()) {
        if (exchange->method() == "GET")
            return exchange->respond(200, json_text(paused_json(paused)));
        require_method(*exchange, "DELETE");
        Json answer = paused_json(paused);
        answer["state"] = "deleted";
        manager_.remove_paused(id, "deleted");
        return exchange->respond(200, json_text(answer));
    }
    if (action == "resume") {
        require_method(*exchange, "POST");
        return manager_.resume(id, [exchange](Sandbox* sandbox, const Refusal* refusal) {
            if (refusal)
                return exchange->refuse(*refusal);
            if (exchange->gone())
                return;  // resumed all the same: it runs under its id
            exchange->respond(200, json_text(sandbox_json(*sandbox)));
        });
    }
    throw RefusedRequest(ServiceError::paused, fmt::format("sandbox {} is paused: resume it first (POST /v1/sandboxes/{}/resume)", id, id));
}

void NativeApi::call(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                      const std::string& op, bool follows)
{
    Json body = json_body(*exchange);
    for (const char* serves_own : {"id", "op"})
        if (body.contains(serves_own))
            throw RefusedRequest(ServiceError::bad_field, fmt::format("\"{}\" is serve's to set: leave it out", serves_own));
    // What an attach or a watch follows has no end but the client's: only a stream carries it.
    bool stream = follows;
    if (body.contains("stream")) {
        if (!body["stream"].is_boolean())
            throw RefusedRequest(ServiceError::bad_field, "\"stream\" must be true or false");
        stream = body["stream"].get<bool>();
        if (follows && !stream)
            throw_bad_field(fmt::format("{} answers only as a stream: leave \"stream\" out, or true", op));
        body.erase("stream");
    }
    Json summary{{"op", op}};
    if ((op == "exec" || op == "spawn") && body.contains("argv"))
        summary["argv"] = clipped(body["argv"]);
    if (op == "shell" && body.contains("cmd"))
        summary["cmd"] = clipped(body["cmd"]);
    if (op == "run_code" && body.contains("code"))
        summary["code"] = clipped(body["code"]);
    if (body.contains("cwd"))
        summary["cwd"] = clipped(body["cwd"]);
    Json request{{"op", op}};
    for (auto& [key, value] : body.items())
        request[key] = std::move(value);
    relay_call(sandbox, exchange, std::move(request), std::move(summary), stream,
               follows ? WhenGone::cancel : WhenGone::forget);
}

void NativeApi::cancel(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                        const std::string& seq_text)
{
    const std::optional<uint64_t> seq = positive_integer(seq_text);
    if (!seq || *seq > sandbox->history().total())
        throw RefusedRequest(ServiceError::not_found, fmt::format("sandbox {} has no call {}", sandbox->id(), seq_text));
    auto on_answer = [exchange](Json&& answer) {
        if (answer.contains("error"))
            return respond_agent_error(*exchange, answer);
        exchange->respond(200, json_text(Json{{"running", answer.value("running", false)}}));
    };
    const bool running = sandbox->cancel(*seq, answering(exchange, CallHandlers{{}, std::move(on_answer)}).on_answer);
    if (!running)
        exchange->respond(200, json_text(Json{{"running", false}}));
}

void NativeApi::file_info(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                           const std::string& op, const std::string& file)
{
    Json request{{"op", op}, {"path", file}};
    if (const std::optional<std::string> max = exchange->query("max_entries"); max && op == "list_dir") {
        const std::optional<uint64_t> entries = positive_integer(*max);
        if (!entries || *entries > max_list_entries)
            throw_bad_field(fmt::format("\"max_entries\" must be an integer from 1 to {}", max_list_entries));
        request["max_entries"] = *entries;
    }
    if (const std::optional<std::string> depth = exchange->query("depth"); depth && op == "list_dir") {
        const std::optional<uint64_t> levels = positive_integer(*depth);
        if (!levels || *levels > max_list_depth)
            throw_bad_field(fmt::format("\"depth\" must be an integer from 1 to {}", max_list_depth));
        request["depth"] = *levels;
    }
    auto on_answer = [exchange](Json&& answer) {
        if (answer.contains("error"))
            return respond_agent_error(*exchange, answer);
        exchange->respond(200, json_text(answer));
    };
    sandbox->call(std::move(request), std::nullopt,
                  answering(exchange, CallHandlers{[](Json&&) {}, std::move(on_answer)}));
}

void NativeApi::port_request(const std::shared_ptr<HttpExchange>& exchange, Sandbox& sandbox,
                             const std::string& action)
{
    const bool raw = action.starts_with("tcp/");
    const std::string rest = action.substr(raw ? 4 : 6);
    const size_t slash = rest.find('/');
    const uint16_t port = GuestPorts::port_number(rest.substr(0, slash));
    if (raw) {
        if (slash != std::string::npos)
            throw RefusedRequest(ServiceError::not_found, fmt::format("no such endpoint: {} .../{}", exchange->method(), action));
        require_method(*exchange, "GET");
        const std::optional<std::string> upgrade = exchange->header("Upgrade");
        if (!upgrade || *upgrade != raw_tcp_upgrade)
            throw RefusedRequest(ServiceError::bad_field,
                                 fmt::format(".../tcp/{} switches the connection to a byte stream: send "
                                             "'Connection: Upgrade' and 'Upgrade: {}'",
                                             port, raw_tcp_upgrade));
        return ports_.relay_tcp(exchange, sandbox, port);
    }
    // "/v1/sandboxes/ID/ports/P/..." -> "/...": the guest's server sees its own paths.
    ports_.relay_http(exchange, sandbox, port, target_after(exchange->target(), 5), {"Authorization"});
}

} // namespace agentvm
