#include "protocol/process_requests.hpp"

#include <signal.h>

#include <array>
#include <limits>
#include <string_view>

#include "protocol/agent_protocol.hpp"
#include "protocol/request_fields.hpp"

namespace agentvm {
namespace {

struct NamedSignal {
    std::string_view name;
    int number;
};

// The signals a client may send: ending, interrupting, stopping and the user's own. Not
// the synchronous ones (SEGV, BUS, ...), which only mimic a crash.
constexpr std::array<NamedSignal, 11> sendable_signals{{
    {"HUP", SIGHUP},
    {"INT", SIGINT},
    {"QUIT", SIGQUIT},
    {"KILL", SIGKILL},
    {"USR1", SIGUSR1},
    {"USR2", SIGUSR2},
    {"PIPE", SIGPIPE},
    {"ALRM", SIGALRM},
    {"TERM", SIGTERM},
    {"CONT", SIGCONT},
    {"STOP", SIGSTOP},
}};

ProcessSelector parse_selector(const Json& object)
{
    const auto pid = object.find("pid");
    const auto tag = object.find("tag");
    const bool has_pid = pid != object.end() && !pid->is_null();
    const bool has_tag = tag != object.end() && !tag->is_null();
    if (has_pid == has_tag)
        throw CallError(has_pid ? "bad_field" : "missing_field",
                        has_pid ? "give \"pid\" or \"tag\", not both" : "missing \"pid\" or \"tag\"");
    if (has_tag)
        return *parse_tag(object);
    if (!pid->is_number_integer() || pid->get<int64_t>() <= 0 || pid->get<int64_t>() > std::numeric_limits<int>::max())
        bad_field("pid", "must be a positive integer");
    return static_cast<int>(pid->get<int64_t>());
}

uint16_t terminal_dimension(const Json& object, const std::string& name)
{
    const Json& value = require(object, name);
    if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 || value.get<uint64_t>() > 4096)
        bad_field(name, "must be an integer from 1 to 4096");
    return static_cast<uint16_t>(value.get<uint64_t>());
}

PtySize parse_pty_size(const Json& object)
{
    return PtySize{terminal_dimension(object, "rows"), terminal_dimension(object, "cols")};
}

} // namespace

SpawnSettings parse_spawn_settings(const Json& object)
{
    SpawnSettings settings;
    if (auto stdin_field = object.find("stdin"); stdin_field != object.end() && !stdin_field->is_null()) {
        if (!stdin_field->is_boolean())
            bad_field("stdin", "must be true (a pipe that send_stdin feeds) or false (/dev/null)");
        settings.keep_stdin = stdin_field->get<bool>();
    }
    if (auto pty = object.find("pty"); pty != object.end() && !pty->is_null()) {
        if (!pty->is_object())
            bad_field("pty", "must be an object with \"rows\" and \"cols\"");
        settings.pty = parse_pty_size(*pty);
    }
    if (auto replay = object.find("replay_bytes"); replay != object.end() && !replay->is_null()) {
        if (!replay->is_number_unsigned() || replay->get<uint64_t>() < min_replay_bytes
            || replay->get<uint64_t>() > max_replay_bytes)
            bad_field("replay_bytes", "must be an integer from " + std::to_string(min_replay_bytes) + " to "
                                          + std::to_string(max_replay_bytes));
        settings.replay_bytes = replay->get<uint64_t>();
    }
    return settings;
}

AttachRequest parse_attach(const Json& object)
{
    AttachRequest attach{parse_selector(object)};
    if (auto replay = object.find("replay"); replay != object.end() && !replay->is_null()) {
        if (!replay->is_boolean())
            bad_field("replay", "must be true or false");
        attach.replay = replay->get<bool>();
    }
    return attach;
}

SendStdinRequest parse_send_stdin(const Json& object)
{
    SendStdinRequest send{parse_selector(object), {}};
    std::optional<std::string> data = get_bytes(object, "data");
    if (!data)
        throw CallError("missing_field", "missing \"data\" or \"data_b64\"");
    send.data = std::move(*data);
    return send;
}

CloseStdinRequest parse_close_stdin(const Json& object)
{
    return CloseStdinRequest{parse_selector(object)};
}

SignalRequest parse_signal(const Json& object)
{
    SignalRequest request{parse_selector(object)};
    const std::optional<int> number = signal_number(require(object, "signal"));
    if (!number)
        bad_field("signal", "must be one of HUP, INT, QUIT, KILL, USR1, USR2, PIPE, ALRM, TERM, CONT, STOP (or its number)");
    request.signal = *number;
    request.group = optional_bool(object, "group");
    return request;
}

ResizeRequest parse_resize(const Json& object)
{
    return ResizeRequest{parse_selector(object), parse_pty_size(object)};
}

std::optional<int> signal_number(const Json& value)
{
    if (value.is_number_integer()) {
        for (const NamedSignal& known : sendable_signals)
            if (value.get<int64_t>() == known.number)
                return known.number;
        return std::nullopt;
    }
    if (!value.is_string())
        return std::nullopt;
    std::string_view name = value.get_ref<const std::string&>();
    if (name.starts_with("SIG"))
        name.remove_prefix(3);
    for (const NamedSignal& known : sendable_signals)
        if (name == known.name)
            return known.number;
    return std::nullopt;
}

std::string signal_name(int signal)
{
    for (const NamedSignal& known : sendable_signals)
        if (signal == known.number)
            return std::string(known.name);
    return std::to_string(signal);
}

} // namespace agentvm
