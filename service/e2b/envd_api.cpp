#include "service/e2b/envd_api.hpp"

#include <array>

#include <fmt/format.h>

#include "common/base64.hpp"
#include "protocol/utf8.hpp"
#include "service/client_auth.hpp"
#include "service/e2b/connect_stream.hpp"
#include "service/e2b/e2b_errors.hpp"
#include "service/e2b/envd_filesystem.hpp"
#include "service/e2b/envd_process.hpp"
#include "service/e2b/sandbox_route.hpp"

namespace agentvm {

using UnaryHandler = void (*)(RpcCall&);
using StreamHandler = void (*)(RpcCall&, const std::shared_ptr<ConnectStream>&);

// One procedure of envd's: a unary or a server-streaming handler, or neither (in envd's
// descriptors, but not served: answered unimplemented).
struct EnvdRpc {
    std::string_view path;
    UnaryHandler unary = nullptr;
    StreamHandler stream = nullptr;
    bool streams = false;
    const char* keepalive = nullptr;  // a stream's keepalive message
    std::chrono::milliseconds grace{0};
};

namespace {

constexpr const char* process_keepalive = R"({"event":{"keepalive":{}}})";
constexpr const char* watch_keepalive = R"({"keepalive":{}})";
// Start's stream ends when its process does, which its timeout kills: the end event, a
// moment after, should reach the client rather than the stream's deadline.
constexpr std::chrono::milliseconds start_grace{2000};

const std::array<EnvdRpc, 17> envd_rpcs{{
    {"/process.Process/Start", nullptr, process_start, true, process_keepalive, start_grace},
    {"/process.Process/Connect", nullptr, process_connect, true, process_keepalive},
    {"/process.Process/List", process_list},
    {"/process.Process/SendInput", process_send_input},
    {"/process.Process/CloseStdin", process_close_stdin},
    {"/process.Process/SendSignal", process_send_signal},
    {"/process.Process/Update", process_update},
    {"/process.Process/StreamInput", nullptr, nullptr, true},
    {"/filesystem.Filesystem/Stat", filesystem_stat},
    {"/filesystem.Filesystem/MakeDir", filesystem_make_dir},
    {"/filesystem.Filesystem/Move", filesystem_move},
    {"/filesystem.Filesystem/ListDir", filesystem_list_dir},
    {"/filesystem.Filesystem/Remove", filesystem_remove},
    {"/filesystem.Filesystem/WatchDir", nullptr, filesystem_watch_dir, true, watch_keepalive},
    {"/filesystem.Filesystem/CreateWatcher"},
    {"/filesystem.Filesystem/GetWatcherEvents"},
    {"/filesystem.Filesystem/RemoveWatcher"},
}};

const EnvdRpc* find_rpc(std::string_view path)
{
    for (const EnvdRpc& rpc : envd_rpcs)
        if (rpc.path == path)
            return &rpc;
    return nullptr;
}

// envd's keepalive when the client names no interval (its GetKeepAliveTicker's default).
constexpr std::chrono::seconds default_keepalive{90};
constexpr uint64_t max_keepalive_s = 3600;

std::chrono::seconds keepalive_interval(const HttpExchange& exchange)
{
    const std::optional<std::string> header = exchange.header("Keepalive-Ping-Interval");
    if (!header || header->empty() || header->size() > 4 || header->find_first_not_of("0123456789") != std::string::npos)
        return default_keepalive;
    const uint64_t seconds = std::stoull(*header);
    if (seconds == 0 || seconds > max_keepalive_s)
        return default_keepalive;
    return std::chrono::seconds(seconds);
}

// The user of `Authorization: Basic base64("name:")`; nullopt without the header.
std::optional<std::string> basic_user(const HttpExchange& exchange)
{
    const std::optional<std::string> header = exchange.header("Authorization");
    if (!header)
        return std::nullopt;
    const auto refuse = [] {
        throw ConnectFailure("unauthenticated", "Authorization must be Basic base64(\"user:\"), naming a user");
    };
    constexpr std::string_view scheme = "basic ";
    if (header->size() <= scheme.size())
        refuse();
    for (size_t i = 0; i < scheme.size(); ++i)
        if (static_cast<char>(std::tolower(static_cast<unsigned char>((*header)[i]))) != scheme[i])
            refuse();
    const std::optional<std::string> decoded = base64_decode(std::string_view(*header).substr(scheme.size()));
    if (!decoded)
        refuse();
    const size_t colon = decoded->find(':');
    std::string user = decoded->substr(0, colon);
    constexpr size_t max_user = 256;
    if (user.empty() || user.size() > max_user || !is_valid_utf8(user))
        refuse();
    for (unsigned char c : user)
        if (c < 0x20 || c == 0x7f)
            refuse();
    return user;
}

// A sandbox's end is 502, as E2B's proxy answers it; everything else as Connect pairs them.
class EnvdRpcErrors : public ErrorWriter {
public:
    Answer refusal(const Refusal& refusal) const override
    {
        if (refusal.code == ServiceError::ended)
            return {502, connect_error_body({"unavailable", refusal.message}), connect_unary_type};
        return e2b_connect_errors().refusal(refusal);
    }
    Answer agent_error(const std::string& code, const std::string& message) const override
    {
        return e2b_connect_errors().agent_error(code, message);
    }
};

const ErrorWriter& envd_rpc_errors()
{
    static const EnvdRpcErrors writer;
    return writer;
}

// An error answered before the RPC runs, at a status of its own.
void answer_status(HttpExchange& exchange, int status, const ConnectError& error)
{
    exchange.respond(status, connect_error_body(error), connect_unary_type);
}

bool identity_encoding(const std::optional<std::string>& encoding)
{
    return !encoding || encoding->empty() || *encoding == "identity";
}

} // namespace

HttpServer::Admission EnvdApi::admit_health(HttpExchange& head, const std::string& sandbox_id)
{
    HttpServer::Admission admission;
    admission.errors = &e2b_http_errors();
    if (head.method() != "GET")
        admission.refusal = Refusal{ServiceError::method_not_allowed, "/health takes GET", std::nullopt};
    else if (!routed_sandbox(manager_, sandbox_id))
        admission.refusal = sandbox_not_running(manager_, sandbox_id);
    admission.handler = [](const std::shared_ptr<HttpExchange>& exchange) { exchange->respond(204, ""); };
    return admission;
}

HttpServer::Admission EnvdApi::admit(HttpExchange& head, const std::string& sandbox_id)
{
    if (head.path() == "/health")
        return admit_health(head, sandbox_id);
    if (head.path() == "/files")
        return files_.admit(head, sandbox_id);
    HttpServer::Admission admission;
    admission.errors = &envd_rpc_errors();
    admission.max_body = envelope_header_size + max_connect_message;
    const std::optional<std::string> token = head.header("X-Access-Token");
    if (!token || !same_secret(*token, tokens_.envd_token(sandbox_id))) {
        admission.refusal = Refusal{ServiceError::unauthorized,
                                    token ? "X-Access-Token is not this sandbox's envd access token"
                                          : "X-Access-Token is required: the sandbox's envdAccessToken",
                                    std::nullopt};
        return admission;
    }
    if (!routed_sandbox(manager_, sandbox_id)) {
        admission.refusal = sandbox_not_running(manager_, sandbox_id);
        return admission;
    }
    const EnvdRpc* rpc = find_rpc(head.path());
    admission.handler = [this, rpc, sandbox_id](const std::shared_ptr<HttpExchange>& exchange) {
        handle_rpc(exchange, rpc, sandbox_id);
    };
    return admission;
}

void EnvdApi::handle_rpc(const std::shared_ptr<HttpExchange>& exchange, const EnvdRpc* rpc,
                         const std::string& sandbox_id)
{
    // Connect's answer to a procedure the server does not have.
    if (!rpc)
        return answer_status(*exchange, 404,
                             {"unimplemented", fmt::format("envd has no procedure {}: agentvm serves process.Process "
                                                           "and filesystem.Filesystem",
                                                           exchange->path())});
    if (exchange->method() != "POST") {
        exchange->add_header("Allow", "POST");
        return answer_status(*exchange, 405,
                             {"invalid_argument", fmt::format("{} takes POST", rpc->path)});
    }
    const std::string content_type = exchange->header("Content-Type").value_or("");
    if (rpc->streams ? !is_stream_json(content_type) : !is_unary_json(content_type))
        return answer_status(*exchange, 415,
                             {"invalid_argument",
                              fmt::format("{} takes Content-Type {}, not \"{}\" (JSON is the one codec served)",
                                          rpc->path, rpc->streams ? connect_stream_type : connect_unary_type,
                                          content_type)});
    std::shared_ptr<Sandbox> sandbox = routed_sandbox(manager_, sandbox_id);
    if (!sandbox)
        return exchange->refuse(sandbox_not_running(manager_, sandbox_id));
    RpcCall call{exchange, sandbox, &manager_.loop(), Json::object(), std::nullopt, std::nullopt,
                 keepalive_interval(*exchange)};
    if (!rpc->streams) {
        try {
            if (!identity_encoding(exchange->header("Content-Encoding")))
                throw ConnectFailure("unimplemented", "compressed requests are not served: send identity encoding");
            if (!rpc->unary)
                throw ConnectFailure("unimplemented", fmt::format("{} is not served by agentvm", rpc->path));
            call.user = basic_user(*exchange);
            if (exchange->body().size() > max_connect_message)
                throw ConnectFailure("resource_exhausted",
                                     fmt::format("the request message is over {} bytes", max_connect_message));
            call.message = parse_connect_message(exchange->body());
            rpc->unary(call);
        } catch (const ConnectFailure& e) {
            answer_unary_error(*exchange, e.error());
        }
        return;
    }
    // A stream's failures, from here on, are in its end envelope: what Connect's clients read.
    std::optional<ConnectError> failure;
    try {
        call.timeout = connect_timeout(exchange->header("Connect-Timeout-Ms"));
        if (call.timeout && call.timeout->count() == 0)
            call.timeout.reset();
    } catch (const ConnectFailure& e) {
        failure = e.error();
    }
    const Json keepalive = rpc->keepalive ? Json::parse(rpc->keepalive) : Json::object();
    std::shared_ptr<ConnectStream> stream = ConnectStream::open(call, keepalive, rpc->grace);
    if (failure)
        return stream->end(failure);
    try {
        if (!identity_encoding(exchange->header("Connect-Content-Encoding")))
            throw ConnectFailure("unimplemented", "compressed streams are not served: send identity encoding");
        if (!rpc->stream)
            throw ConnectFailure("unimplemented",
                                 fmt::format("{} is not served by agentvm: the SDKs never call it", rpc->path));
        call.user = basic_user(*exchange);
        call.message = parse_connect_message(single_envelope_message(exchange->body()));
        rpc->stream(call, stream);
    } catch (const ConnectFailure& e) {
        stream->end(e.error());
    }
}

} // namespace agentvm
