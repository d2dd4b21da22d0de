// What a sandbox keeps of the calls it ran, for a harness to grade and log a trajectory
// (docs/api.md, "History"): per call the request's summary, when it started, how long it took
// and its result, with at most the first output_kept bytes of each output stream and at most
// fields_kept bytes of its other fields (a run_code result, a traceback, an error message:
// the guest's to make as long as a line may be). Bounded: past `limit` entries the oldest
// are dropped, and counted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

class CallHistory {
public:
    static constexpr size_t output_kept = 4096;
    // What an entry keeps of the answer's fields other than stdout and stderr, counted as
    // their JSON text (names, strings, numbers); past it strings are cut (on a UTF-8
    // character's boundary), members and elements left out, and the result says "clipped".
    static constexpr size_t fields_kept = 4096;
    // Deeper than this, a value is left out (no honest answer nests so).
    static constexpr int depth_kept = 16;

    explicit CallHistory(size_t limit) : limit_(limit) {}

    // A call starts: returns its sequence number, for the calls below.
    uint64_t begin(Json request_summary);
    // Output bytes of a running call, as they stream (kept up to output_kept per stream).
    void add_output(uint64_t seq, const std::string& stream, std::string_view bytes);
    // The call's answer: a response (its output fields are kept clipped) or an error.
    void end(uint64_t seq, const Json& answer);

    // {"calls":[...], "dropped": N}
    Json to_json() const;
    uint64_t total() const { return next_seq_ - 1; }

private:
    struct Entry {
        uint64_t seq;
        Json request;
        std::chrono::system_clock::time_point started_wall;
        std::optional<Json> answer;
        std::string stdout_kept;
        std::string stderr_kept;
        bool stdout_clipped = false;
        bool stderr_clipped = false;
        bool streamed = false;
    };
    Entry* find(uint64_t seq);

    size_t limit_;
    std::deque<Entry> entries_;
    uint64_t next_seq_ = 1;
    uint64_t dropped_ = 0;
};

} // namespace agentvm
