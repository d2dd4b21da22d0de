// What SandboxFusion's /run_code and /run_jupyter share (docs/api.md): a fresh sandbox from
// the default pool for one request, its work directory made and the request's files written
// there, the job's own run, then the wanted files fetched, the answer sent and the sandbox
// deleted. SandboxFusion answers 200 with a status (Success, Failed, SandboxError) for all
// that happens once the request was accepted; serve's own refusals keep their HTTP status.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

// Where the request's files go; relative paths are relative to it. Also where the code runs.
inline constexpr const char* fusion_work_dir = "/tmp/run_code";

// What a job may last beyond its own timeouts before serve deletes its sandbox regardless.
inline constexpr int fusion_sandbox_slack_s = 60;

// A body of /run_code or /run_jupyter (up to 16 MiB: files travel base64 inside the JSON).
inline constexpr size_t max_fusion_body = size_t{16} << 20;

struct FusionFiles {
    std::vector<std::pair<std::string, std::string>> files;  // path, bytes
    std::vector<std::string> fetch_files;
};

// The body as a JSON object; throws RefusedRequest (bad_json).
Json fusion_body(const std::string& text);
// `files` and `fetch_files` of a body; throws RefusedRequest (bad_field).
FusionFiles parse_fusion_files(const Json& body);
// A number field within [min, max], or `fallback` when absent; throws RefusedRequest (bad_field).
double fusion_number(const Json& body, const char* name, double fallback, double min, double max);

// A call's "stdout" or "stderr" (either spelling of docs/protocol.md), empty when it has none
// or it is malformed; at most `max_bytes` of it (the max_output the call asked for: the guest
// may not have kept to it).
std::string output_of(const Json& answer, const char* stream, size_t max_bytes = SIZE_MAX);

// What one request's fetch_files may bring back, all files together (--fusion-fetch-max),
// counted here on the bytes the guest sends: its stat of a file only lets a file that is
// plainly too large, or not a regular file at all (a link to /dev/zero, a FIFO, a
// directory), be refused before any byte of it is read; the file may grow, and a guest may
// lie.
class FetchBudget {
public:
    explicit FetchBudget(uint64_t max_bytes) : max_(max_bytes), left_(max_bytes) {}
    // Why the file that `stat_answer` (the agent's answer to stat, which follows links)
    // describes is not fetched, if it is not.
    std::optional<std::string> refuse(const std::string& path, const Json& stat_answer) const;
    // Adds `bytes` to `content` when they fit in what is left; false (nothing added) when not.
    bool take(std::string& content, std::string_view bytes);
    // The answer's words for a file that did not fit.
    std::string over(const std::string& path) const;
    uint64_t left() const { return left_; }

private:
    uint64_t max_;
    uint64_t left_;
};

class FusionJob : public std::enable_shared_from_this<FusionJob> {
public:
    FusionJob(SandboxManager& manager, std::shared_ptr<HttpExchange> exchange, FusionFiles files);
    virtual ~FusionJob() = default;

    // Creates the sandbox (living `lifetime_s`), then the work directory and files, then run().
    void start(double lifetime_s, Json metadata);

protected:
    // The job's own part, once its files are queued: it ends with done() or sandbox_error().
    virtual void run() = 0;
    // Adds the job's fields to the answer, after "status" and "message".
    virtual void describe(Json& answer) const = 0;

    // Fetches the wanted files, then answers with `status` (SandboxError if a file could
    // not be written).
    void done(const char* status);
    void sandbox_error(const std::string& message);
    // Sends a request to the job's sandbox, not recorded in its history.
    void send(Json request, std::function<void(Json&&)> on_answer);
    SandboxManager& manager() { return manager_; }
    // What a run, or all the cells of a request together, keep of each output stream.
    uint64_t output_max() const { return manager_.config().fusion_output_max; }

private:
    void make_dirs();
    void write_files();
    void fetch_next(size_t index, const char* status);
    void read_next(size_t index, const char* status);
    void respond(const char* status, const std::string& message);

    SandboxManager& manager_;
    std::shared_ptr<HttpExchange> exchange_;
    FusionFiles files_;
    // Weak: the sandbox's pending calls hold this job, and the job must not keep the
    // sandbox (and its VM) alive past serve's end.
    std::weak_ptr<Sandbox> sandbox_;
    std::string sandbox_id_;
    std::string write_failed_;
    std::map<std::string, std::string> fetched_;
    FetchBudget fetch_budget_;
    bool answered_ = false;
};

} // namespace agentvm
