// The process ops (docs/protocol.md, "Processes"): a command started in the background by
// `spawn` outlives the request and the connection that started it; `attach`, `send_stdin`,
// `close_stdin`, `signal` and `resize` find it (or an exec call's command) by its guest pid
// or its client-chosen tag, `list_processes` lists them all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

namespace agentvm {

struct ExecRequest;

// Which process a request means: its guest pid, or the tag it was started with.
using ProcessSelector = std::variant<int, std::string>;

// Output a process keeps for a late attach: at least what one read of its pipe brings (so a
// live attachment never misses the newest), by default, and at most.
constexpr uint64_t min_replay_bytes = uint64_t{64} << 10;
constexpr uint64_t default_replay_bytes = uint64_t{1} << 20;
constexpr uint64_t max_replay_bytes = uint64_t{16} << 20;

struct PtySize {
    uint16_t rows = 24;
    uint16_t cols = 80;
};

struct SpawnSettings {
    bool keep_stdin = false;            // "stdin":true: a pipe fed by send_stdin, else /dev/null
    std::optional<PtySize> pty;         // a pseudo-terminal for stdin, stdout and stderr
    uint64_t replay_bytes = default_replay_bytes;
};

struct AttachRequest {
    ProcessSelector process;
    bool replay = true;  // from the oldest byte kept, else from now on
};

struct ListProcessesRequest {};

struct SendStdinRequest {
    ProcessSelector process;
    std::string data;
};

struct CloseStdinRequest {
    ProcessSelector process;
};

struct SignalRequest {
    ProcessSelector process;
    int signal = 0;
    bool group = false;  // the whole process group, not the process alone
};

struct ResizeRequest {
    ProcessSelector process;
    PtySize size;
};

// Each throws CallError (missing_field, bad_field) naming the field.
SpawnSettings parse_spawn_settings(const nlohmann::ordered_json& object);
AttachRequest parse_attach(const nlohmann::ordered_json& object);
SendStdinRequest parse_send_stdin(const nlohmann::ordered_json& object);
CloseStdinRequest parse_close_stdin(const nlohmann::ordered_json& object);
SignalRequest parse_signal(const nlohmann::ordered_json& object);
ResizeRequest parse_resize(const nlohmann::ordered_json& object);

// "TERM", "SIGTERM" or 15 -> 15; nullopt for a signal the op does not send.
std::optional<int> signal_number(const nlohmann::ordered_json& value);
// 15 -> "TERM".
std::string signal_name(int signal);

} // namespace agentvm
