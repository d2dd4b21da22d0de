// envd's process.Process service (docs/e2b.md, "Commands") on the agent's processes
// (docs/protocol.md, "Processes"):
// - Start spawns the command (argv [cmd, args...], its envs, cwd, stdin, pty and tag; its
//   lifetime Connect-Timeout-Ms) and attaches to it from its first byte; Connect attaches to a
//   running one (by pid or tag) from now on. Both stream {"event":{"start":{pid}}} first, then
//   its output as data events and last its end, and when the client goes away only the attach
//   is cancelled: the process runs on (a background command, disconnect()).
// - List lists the running exec and spawn processes; SendInput, CloseStdin, SendSignal (to the
//   process group) and Update (a pty's size) are send_stdin, close_stdin, signal and resize.
// The mapping of messages is in pure functions, unit-tested without a sandbox.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "service/e2b/connect_stream.hpp"
#include "service/e2b/connect_wire.hpp"

namespace agentvm {

// What a process may keep for Start's attach, which comes after it runs: the agent's most, so
// that a burst of output before the attach is not lost.
inline constexpr uint64_t start_replay_bytes = uint64_t{16} << 20;

// StartRequest -> the agent's spawn (without its user). Throws ConnectFailure.
Json spawn_request(const Json& start_message, std::optional<std::chrono::milliseconds> timeout);
// A message's ProcessSelector ("process": {pid} or {tag}) -> the agent's {"pid"} or {"tag"}.
Json process_selector(const MessageReader& request);
// SendSignalRequest's signal -> the agent's name ("KILL", "TERM").
std::string agent_signal(const MessageReader& request);

// StartResponse / ConnectResponse messages.
Json process_start_event(int64_t pid);
// An attach's output event (stdout, stderr, pty) as a data event; nullopt for the others.
std::optional<Json> process_data_event(const Json& agent_event);
// An attach's answer (how the process ended) as the end event.
Json process_end_event(const Json& attach_answer);
// "exit status 3", "signal: killed": how Go's os.ProcessState says it, as envd does.
std::string exit_status_text(const Json& attach_answer);
// list_processes' answer -> ListResponse.
Json process_list_response(const Json& list_answer);

// The RPCs. A stream's handler is given its stream, already open; a ConnectFailure thrown
// fails the RPC (in the stream's end, or as the unary error).
void process_start(RpcCall& call, const std::shared_ptr<ConnectStream>& stream);
void process_connect(RpcCall& call, const std::shared_ptr<ConnectStream>& stream);
void process_list(RpcCall& call);
void process_send_input(RpcCall& call);
void process_close_stdin(RpcCall& call);
void process_send_signal(RpcCall& call);
void process_update(RpcCall& call);

} // namespace agentvm
