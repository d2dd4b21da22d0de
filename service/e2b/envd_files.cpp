#include "service/e2b/envd_files.hpp"

#include <chrono>

#include <fmt/format.h>

#include "protocol/utf8.hpp"
#include "service/call_relay.hpp"
#include "service/e2b/e2b_errors.hpp"
#include "service/e2b/file_access.hpp"
#include "service/e2b/files_upload.hpp"
#include "service/e2b/sandbox_route.hpp"
#include "service/file_transfer.hpp"

namespace agentvm {
namespace {

HttpServer::Admission with_refusal(HttpServer::Admission admission, ServiceError code, std::string message)
{
    admission.refusal = Refusal{code, std::move(message), std::nullopt};
    return admission;
}

long long unix_now()
{
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// The ?path= of the request: the SDK always names the file there, but for a multipart body
// whose parts' filenames do (files.write with several files, an uploadUrl() without a path).
// UTF-8 only: the agent protocol carries a path as a JSON string.
std::optional<std::string> file_path(const HttpExchange& exchange, bool required)
{
    std::optional<std::string> path = exchange.query("path");
    if (path && path->empty())
        path.reset();
    if (!path && required)
        throw RefusedRequest(ServiceError::missing_field, "the file is named by the query argument ?path=");
    if (path && !is_valid_utf8(*path))
        throw RefusedRequest(ServiceError::bad_field, "?path= must be UTF-8 once percent-decoded");
    return path;
}

// ?username=: the user the agent's file calls run as (its "user"); none leaves the agent's own.
std::optional<std::string> file_user(const HttpExchange& exchange)
{
    std::optional<std::string> user = exchange.query("username");
    if (user && user->empty())
        user.reset();
    if (user && !is_valid_utf8(*user))
        throw RefusedRequest(ServiceError::bad_field, "?username= must be UTF-8 once percent-decoded");
    return user;
}

// envd answers a directory 400 and a missing file 404; read_file would answer both `io` or
// `not_found` without telling them apart, so the file is looked at first.
void download(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
              const std::string& path, const std::optional<std::string>& user)
{
    Json stat{{"op", "stat"}, {"path", path}};
    if (user)
        stat["user"] = *user;
    std::weak_ptr<Sandbox> weak = sandbox;
    auto on_answer = [weak, exchange, path, user](Json&& answer) {
        if (answer.contains("error"))
            return respond_agent_error(*exchange, answer);
        if (answer.value("type", "") == "dir")
            return exchange->refuse(ServiceError::bad_field, fmt::format("path '{}' is a directory", path));
        if (exchange->gone())
            return;
        auto held = weak.lock();
        if (!held || held->stopping())
            return exchange->refuse(ServiceError::ended, "the sandbox ended during the download");
        start_download(held, exchange, path, user);
    };
    sandbox->call(std::move(stat), std::nullopt, answering(exchange, CallHandlers{{}, std::move(on_answer)}));
}

} // namespace

HttpServer::Admission EnvdFiles::admit(HttpExchange& head, const std::string& sandbox_id)
{
    HttpServer::Admission admission;
    admission.errors = &e2b_http_errors();
    const bool read = head.method() == "GET";
    if (!read && head.method() != "POST")
        return with_refusal(std::move(admission), ServiceError::bad_field,
                       fmt::format("/files takes GET (read a file) or POST (write files), not {}", head.method()));
    FileAccess access;
    access.access_token = head.header("X-Access-Token");
    access.signature = head.query("signature");
    access.signature_expiration = head.query("signature_expiration");
    access.path = head.query("path").value_or("");
    access.user = head.query("username").value_or("");
    access.operation = read ? "read" : "write";
    if (std::optional<std::string> why = file_access_refusal(tokens_, sandbox_id, access, unix_now()))
        return with_refusal(std::move(admission), ServiceError::unauthorized, std::move(*why));
    if (!routed_sandbox(manager_, sandbox_id)) {
        admission.refusal = sandbox_not_running(manager_, sandbox_id);
        return admission;
    }
    // An upload's size is bounded by the guest's disk, not by a buffer here.
    admission.streams_body = !read;
    admission.handler = [this, read, sandbox_id](const std::shared_ptr<HttpExchange>& exchange) {
        // An upload is refused once its body has started to come (refuse_upload says why).
        auto refuse = [&](Refusal refusal) {
            if (read)
                return exchange->refuse(refusal);
            refuse_upload(exchange, std::move(refusal));
        };
        try {
            std::shared_ptr<Sandbox> sandbox = routed_sandbox(manager_, sandbox_id);
            if (!sandbox)
                return refuse(sandbox_not_running(manager_, sandbox_id));
            if (read)
                return download(sandbox, exchange, *file_path(*exchange, true), file_user(*exchange));
            start_files_upload(sandbox, exchange, file_path(*exchange, false), file_user(*exchange));
        } catch (const RefusedRequest& e) {
            refuse(Refusal{e.code, e.what(), std::nullopt});
        }
    };
    return admission;
}

} // namespace agentvm
