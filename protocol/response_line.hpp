// How long a response line of the agent (docs/protocol.md) can honestly be: the one bound
// that the episode relay (episode/episode_relay.hpp) and serve (service/episode_process.hpp)
// size their line limits with, each for the largest max_output it lets a call ask for.
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentvm {

// Six bytes per output byte at worst (a control byte escaped as \u00XX), two streams, and
// 16 MiB for the other fields: a run_code result is cut to 1 MiB (six times that escaped, at
// worst), its message and traceback to 64 KiB each, its rich forms ("formats") to 4 MiB as
// JSON text all together; a read_file event carries 1 MiB in base64. Only a guest that breaks
// the protocol sends a longer line.
constexpr size_t max_response_line_for(uint64_t max_output)
{
    return static_cast<size_t>(12 * max_output) + (size_t{16} << 20);
}

} // namespace agentvm
