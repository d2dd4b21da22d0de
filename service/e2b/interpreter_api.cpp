#include "service/e2b/interpreter_api.hpp"

#include <fmt/format.h>

#include "protocol/json_depth.hpp"
#include "service/call_relay.hpp"
#include "service/client_auth.hpp"
#include "service/e2b/e2b_errors.hpp"
#include "service/e2b/e2b_request.hpp"
#include "service/e2b/interpreter_wire.hpp"
#include "service/e2b/sandbox_route.hpp"
#include "service/native/native_wire.hpp"

namespace agentvm {
namespace {

constexpr const char* traffic_token_header = "E2B-Traffic-Access-Token";
// A cell's source, with its env: larger than the 1 MiB other bodies get, far under the
// agent's 64 MiB line.
constexpr size_t max_execute_body = size_t{8} << 20;
// What a call's history entry keeps of a cell's source.
constexpr size_t max_summary_code = 1024;
// Counts are pruned of ended sandboxes once this many sandboxes have some.
constexpr size_t counts_pruned_past = 256;

// A call whose answer is the request's whole answer: `on_success` makes it from a good one.
void answer_call(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                 Json request, std::optional<Json> summary, std::function<void(Json&&)> on_success)
{
    auto on_answer = [exchange, on_success = std::move(on_success)](Json&& answer) {
        if (answer.contains("error"))
            return respond_agent_error(*exchange, answer);
        on_success(std::move(answer));
    };
    sandbox->call(std::move(request), std::move(summary), answering(exchange, CallHandlers{{}, std::move(on_answer)}));
}

// An execution answered at once with one error (a language agentvm does not run): a stream,
// as a cell's error is, so that the SDK shows the message as the execution's error.
void answer_execution_error(HttpExchange& exchange, Json error)
{
    exchange.start_stream(200, "application/x-ndjson");
    exchange.write(ndjson_line(error));
    exchange.write(ndjson_line(end_of_execution_line()));
    exchange.finish();
}

} // namespace

void InterpreterApi::ExecutionCounts::reset(const std::string& sandbox_id, const std::string& context)
{
    const auto found = by_sandbox.find(sandbox_id);
    if (found != by_sandbox.end())
        found->second.erase(context);
}

HttpServer::Admission InterpreterApi::admit(HttpExchange& head, const std::string& sandbox_id)
{
    HttpServer::Admission admission;
    admission.errors = &e2b_http_errors();
    const std::optional<std::string> traffic = head.header(traffic_token_header);
    const std::optional<std::string> access = head.header("X-Access-Token");
    const bool allowed = (traffic && same_secret(*traffic, tokens_.traffic_token(sandbox_id)))
                         || (access && same_secret(*access, tokens_.envd_token(sandbox_id)));
    if (!allowed) {
        admission.refusal = Refusal{ServiceError::unauthorized,
                                    traffic || access
                                        ? fmt::format("the access token does not open sandbox {}", sandbox_id)
                                        : fmt::format("the code interpreter needs sandbox {}'s trafficAccessToken as "
                                                      "{} (or its envdAccessToken as X-Access-Token)",
                                                      sandbox_id, traffic_token_header),
                                    std::nullopt};
        return admission;
    }
    if (!routed_sandbox(manager_, sandbox_id)) {
        admission.refusal = sandbox_not_running(manager_, sandbox_id);
        return admission;
    }
    if (head.path() == "/execute")
        admission.max_body = max_execute_body;
    admission.handler = [this, sandbox_id](const std::shared_ptr<HttpExchange>& exchange) {
        try {
            handle(exchange, sandbox_id);
        } catch (const RefusedRequest& e) {
            exchange->refuse(e.code, e.what());
        }
    };
    return admission;
}

void InterpreterApi::handle(const std::shared_ptr<HttpExchange>& exchange, const std::string& sandbox_id)
{
    std::shared_ptr<Sandbox> sandbox = routed_sandbox(manager_, sandbox_id);
    if (!sandbox)
        return exchange->refuse(sandbox_not_running(manager_, sandbox_id));
    const std::string& path = exchange->path();
    if (path == "/execute") {
        require_method(*exchange, "POST");
        return execute(exchange, sandbox);
    }
    if (path == "/contexts" || path.starts_with("/contexts/"))
        return contexts(exchange, sandbox, path.substr(std::string_view("/contexts").size()));
    if (path == "/health") {
        require_method(*exchange, "GET");
        return exchange->respond(200, "\"OK\"");
    }
    throw RefusedRequest(ServiceError::not_found,
                         fmt::format("no such endpoint: {} {} (the code interpreter serves /execute and /contexts)",
                                     exchange->method(), path));
}

void InterpreterApi::execute(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox)
{
    const ExecuteRequest cell = parse_execute_request(json_body(*exchange));
    if (cell.unsupported_language)
        return answer_execution_error(
            *exchange, error_line("UnsupportedLanguage", unsupported_language_message(*cell.unsupported_language), ""));
    prune_counts();

    Json request{{"op", "run_code"}, {"code", cell.code}, {"stream", "only"}};
    if (cell.context)
        request["context"] = *cell.context;
    if (cell.language)
        request["language"] = *cell.language;
    if (cell.env)
        request["env"] = *cell.env;
    Json summary{{"op", "run_code"},
                 {"code", cell.code.size() > max_summary_code ? cell.code.substr(0, max_summary_code) + "…"
                                                               : cell.code}};
    if (cell.context)
        summary["context"] = *cell.context;
    const std::string context = cell.context ? *cell.context : cell.language == "bash" ? "default-bash" : "default";

    // Starts the cell and its stream. A client that goes away leaves the cell running, as
    // Jupyter does: interrupting it would be the agent's cancel, which kills the interpreter
    // and every variable of the context with it.
    auto run = [counts = counts_, sandbox_id = sandbox->id(), context](
                   const std::shared_ptr<Sandbox>& held, const std::shared_ptr<HttpExchange>& client, Json call,
                   Json record) {
        auto lines = std::make_shared<ExecutionLines>();
        auto pacer = std::make_shared<StreamPacer>(held, client);
        CallHandlers handlers;
        handlers.on_event = [client, pacer, lines](Json&& event) {
            const std::string timestamp = line_timestamp();
            for (const Json& line : lines->event(event, timestamp))
                client->write(ndjson_line(line));
            pacer->after_write();
        };
        handlers.on_answer = [client, pacer, lines, counts, sandbox_id, context](Json&& answer) {
            pacer->release();
            for (const Json& line : lines->answer(answer, line_timestamp()))
                client->write(ndjson_line(line));
            if (!answer.contains("error") && !answer.value("cancelled", false))
                client->write(ndjson_line(executions_line(counts->next(sandbox_id, context))));
            if (answer.value("state_lost", false))
                counts->reset(sandbox_id, context);
            client->write(ndjson_line(end_of_execution_line()));
            client->finish();
        };
        const uint64_t id = held->call(std::move(call), std::move(record), answering(client, std::move(handlers)));
        client->start_stream(200, "application/x-ndjson");
        forget_call_when_gone(*client, held, id, std::move(pacer), WhenGone::forget);
    };
    if (!cell.context)
        return run(sandbox, exchange, std::move(request), std::move(summary));

    // A context that does not exist is E2B's 404, which must come before the stream starts:
    // the agent's own not_found would come as the cell's answer, inside it.
    std::weak_ptr<Sandbox> weak = sandbox;
    answer_call(sandbox, exchange, Json{{"op", "list_contexts"}}, std::nullopt,
                [weak, exchange, run, context, request = std::move(request), summary = std::move(summary)](
                    Json&& answer) mutable {
                    const Json contexts = answer.value("contexts", Json::array());
                    const bool exists = contexts.is_array()
                                        && std::any_of(contexts.begin(), contexts.end(), [&](const Json& entry) {
                                               return entry.is_object() && entry.value("context", "") == context;
                                           });
                    if (!exists)
                        return exchange->refuse(ServiceError::not_found, fmt::format("Context {} not found", context));
                    if (exchange->gone())
                        return;
                    auto held = weak.lock();
                    if (!held || held->stopping())
                        return exchange->refuse(ServiceError::ended, "the sandbox ended before the cell started");
                    run(held, exchange, std::move(request), std::move(summary));
                });
}

void InterpreterApi::contexts(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                              const std::string& rest)
{
    if (rest.empty()) {
        if (exchange->method() == "GET")
            return answer_call(sandbox, exchange, Json{{"op", "list_contexts"}}, std::nullopt, [exchange](Json&& answer) {
                Json list = Json::array();
                for (const Json& entry : answer.value("contexts", Json::array()))
                    if (entry.is_object())
                        list.push_back(context_json(entry));
                exchange->respond(200, json_text(list));
            });
        require_method(*exchange, "POST");
        const ContextRequest wanted = parse_context_request(json_body(*exchange));
        Json request{{"op", "create_context"}};
        if (wanted.language)
            request["language"] = *wanted.language;
        if (wanted.cwd)
            request["cwd"] = *wanted.cwd;
        return answer_call(sandbox, exchange, request, request, [exchange](Json&& answer) {
            exchange->respond(200, json_text(context_json(answer)));
        });
    }
    // "/ID" or "/ID/restart"
    std::string id = rest.substr(1);
    bool restart = false;
    if (id.ends_with("/restart")) {
        id.resize(id.size() - std::string_view("/restart").size());
        restart = true;
    }
    if (id.empty() || id.find('/') != std::string::npos)
        throw RefusedRequest(ServiceError::not_found,
                             fmt::format("no such endpoint: {} {}", exchange->method(), exchange->path()));
    require_method(*exchange, restart ? "POST" : "DELETE");
    const Json request{{"op", restart ? "restart_context" : "remove_context"}, {"context", id}};
    answer_call(sandbox, exchange, request, request, [exchange, counts = counts_, sandbox_id = sandbox->id(), id](Json&&) {
        counts->reset(sandbox_id, id);
        exchange->respond(204, "");
    });
}

void InterpreterApi::prune_counts()
{
    if (counts_->by_sandbox.size() < counts_pruned_past)
        return;
    std::erase_if(counts_->by_sandbox, [this](const auto& entry) {
        return !manager_.find(entry.first) && !manager_.find_paused(entry.first);
    });
}

} // namespace agentvm
