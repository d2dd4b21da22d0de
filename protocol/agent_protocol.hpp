// The agent's wire protocol (docs/protocol.md): parsing one request line into a typed
// request, and building the response lines. Pure: no I/O, so the unit tests drive it with
// malformed input directly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "protocol/context_requests.hpp"
#include "protocol/file_requests.hpp"
#include "protocol/process_requests.hpp"

namespace agentvm {

// Ordered so that "id" leads each line, which keeps logs and transcripts readable.
using Json = nlohmann::ordered_json;

// This protocol's version (docs/protocol.md), printed by `agentvm --version`. Raised when a
// change would break a peer written against the previous one.
constexpr int protocol_version = 2;

// Longest request line accepted; longer ones are answered with line_too_long.
constexpr size_t max_line_bytes = size_t{64} << 20;
constexpr uint64_t default_max_output = uint64_t{16} << 20;
constexpr size_t read_chunk_bytes = size_t{1} << 20;
// The longest "timeout" a call may have: a year. Longer than any episode, and far inside what
// a timer or a steady_clock deadline in nanoseconds can hold (1e300 seconds would overflow both).
constexpr long max_call_timeout_s = 365L * 24 * 3600;

// A failed call: becomes {"id":…, "error":{"code":…, "message":…}} and the connection goes on.
class CallError : public std::runtime_error {
public:
    CallError(std::string code, const std::string& message)
        : std::runtime_error(message), code_(std::move(code))
    {
    }
    const std::string& code() const { return code_; }

private:
    std::string code_;
};

// A client's own name for a process it starts (exec, spawn), by which later requests find it.
constexpr size_t max_tag_bytes = 256;

// A call's "user": a name in the guest's /etc/passwd, whose credentials the call acts with
// instead of the image's user's (docs/protocol.md, "A call's user").
constexpr size_t max_user_name_bytes = 64;

struct ExecRequest {
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
    std::optional<std::string> cwd;  // absent: the user's home with "user", else the agent's
    std::optional<std::string> tag;
    std::optional<std::string> user;
    std::optional<std::string> stdin_data;
    std::optional<double> timeout_s;
    uint64_t max_output = default_max_output;
    bool stream = false;              // output is sent as events while the command runs
    bool output_in_response = true;   // false for "stream":"only"
};

// exec's command started in the background: it outlives the request and its connection, and
// is reached later by its pid or tag (process_requests.hpp).
struct SpawnRequest {
    ExecRequest command;  // max_output, stream and stdin_data unused
    SpawnSettings settings;
};

// One command line for the connection's persistent bash (see shell.hpp).
struct ShellRequest {
    std::string cmd;
    std::optional<double> timeout_s;
    uint64_t max_output = default_max_output;
    bool stream = false;
    bool output_in_response = true;
};

struct WriteFileRequest {
    std::string path;
    std::string data;
    std::optional<uint32_t> mode;
    bool append = false;
    std::optional<std::string> user;
};

struct ReadFileRequest {
    std::string path;
    std::optional<std::string> user;
};

struct CloseRequest {};

// One cell for one of the agent's interpreter contexts, Python or bash (guest/agent/contexts.hpp).
struct RunCodeRequest {
    std::string code;
    std::optional<CodeLanguage> language;  // absent: the context's, or python without one
    std::optional<std::string> context;    // absent: the default context of the language
    std::map<std::string, std::string> env;  // set for this cell only
    std::optional<double> timeout_s;
    uint64_t max_output = default_max_output;  // also bounds the result's repr and each rich form
    bool stream = false;
    bool output_in_response = true;
};

struct StatRequest {
    std::string path;
    std::optional<std::string> user;
};

constexpr uint32_t default_list_entries = 10000;
constexpr uint32_t max_list_entries = 100000;

struct ListDirRequest {
    std::string path;
    uint32_t max_entries = default_list_entries;
    uint32_t depth = 1;  // 1: the directory's own entries; more: its subdirectories' too
    std::optional<std::string> user;
};

// Kills the running call whose id is `call`.
struct CancelRequest {
    Json call;
};

// The VM was resumed from a snapshot: the guest clock is set to the host's and the kernel's
// random-number generator is reseeded with host entropy, so clones of one snapshot neither
// live in the past nor share their "random" numbers.
struct ResumeRequest {
    uint64_t time_ns = 0;  // host CLOCK_REALTIME, nanoseconds since the epoch
    std::string entropy;   // 16-512 bytes from the host's CSPRNG
    // The tool calls' pids.max for this episode (agentvm --guest-pids), which may differ from
    // the one the snapshot was baked with.
    std::optional<uint32_t> pids_max;
};

// Host-side, never sent to the guest: `agentvm episode --snapshot-dir DIR` writes a live
// snapshot of the whole VM (vmm/snapshot.hpp) to DIR/name, which another episode restores with
// --snapshot: a fork, or a pause to disk.
struct SnapshotRequest {
    std::string name;  // 1 to max_snapshot_name_bytes of [A-Za-z0-9._-], not starting with '.'
};

constexpr size_t max_snapshot_name_bytes = 128;

constexpr size_t min_resume_entropy = 16;
constexpr size_t max_resume_entropy = 512;

struct Request {
    Json id;
    std::variant<ExecRequest, ShellRequest, RunCodeRequest, WriteFileRequest, ReadFileRequest, StatRequest, ListDirRequest,
                 CancelRequest, CloseRequest, ResumeRequest, SnapshotRequest, SpawnRequest, AttachRequest,
                 ListProcessesRequest, SendStdinRequest, CloseStdinRequest, SignalRequest, ResizeRequest,
                 CreateContextRequest, ListContextsRequest, RestartContextRequest, RemoveContextRequest,
                 MakeDirRequest, MoveRequest, RemoveRequest, WatchRequest>
        op;
};

// A line that cannot become a Request: the error plus whatever id could be recovered
// (null when the line is not even a JSON object with an id).
struct RequestError {
    Json id;
    CallError error;
};

// Throws RequestError.
Request parse_request(std::string_view line);

// The binary-safety rule: `name` when the bytes are valid UTF-8, `name_b64` otherwise.
// (By value: a caller done with megabytes of output moves them in rather than copy them.)
void put_bytes(Json& object, const std::string& name, std::string bytes);
// Reads `name` or `name_b64`; nullopt when neither is present. Throws CallError
// (bad_field) when both are, or the value is not a string or not valid base64.
std::optional<std::string> get_bytes(const Json& object, const std::string& name);

// "0644" <-> 0644; throws CallError(bad_field) for anything but 1-4 octal digits.
uint32_t parse_mode(const std::string& text);
std::string format_mode(uint32_t mode);

Json error_response(const Json& id, const std::string& code, const std::string& message);
// One protocol line: compact JSON and '\n'. Never throws on odd bytes in strings (they
// become U+FFFD); byte-carrying fields have already gone through put_bytes.
std::string to_line(const Json& message);
// The same line, handed to `put` in pieces of about `piece` bytes as it is written, so it
// never exists whole (a response with 64 MiB of escaped output would take 384 MiB), and its
// first bytes can leave at once. Stops when `put` returns false, and returns false then.
bool write_line(const Json& message, size_t piece, const std::function<bool(std::string_view)>& put);

} // namespace agentvm
