// The calls `agentvm snapshot bake` makes of the guest agent before it pauses the guest, and
// how it judges each answer. The answers come from the guest, whose image (a template's) is
// the user's: any line, however malformed, fails the bake with a message, never the VMM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// One call of the bake, in order, each sent once the one before is answered.
struct BakeCall {
    Json call;
    std::string what;        // for messages: "--run 2 (make -j4)"
    bool log_writes = false; // the warm pages: answered under KVM's dirty log
    bool closes = false;     // the agent closes the connection after answering
    // Ours, to warm caches: in an image without the program (a distroless or busybox image
    // lacking `true` or a shell) its not_found answer is no failure.
    bool may_be_missing = false;
};

// What a --run or --warm-up step may print that a failure then shows.
inline constexpr uint64_t bake_step_output_bytes = 64 * 1024;
// An answer line: a step's output (base64 at worst) and the rest of the response.
inline constexpr size_t max_bake_answer_line = 4 * bake_step_output_bytes + 64 * 1024;

// The user's --run steps and --warm-up commands (each `/bin/sh -c` in its own process, as a
// Containerfile's RUN, with step_timeout_s), then ours (bake_calls.cpp says why), then close.
std::vector<BakeCall> bake_calls(const std::vector<std::string>& run, const std::vector<std::string>& warm_up,
                                 double step_timeout_s);

// Why `line`, the agent's answer to `call`, fails the bake, or "" when it succeeded.
std::string failure_of(const BakeCall& call, const std::string& line);

} // namespace agentvm
