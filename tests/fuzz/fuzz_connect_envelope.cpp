// Fuzzes what a client hands envd's Connect-RPC (service/e2b/connect_wire.hpp): the input is a
// server stream's request body, read as its one envelope, its message parsed, then mapped as
// each of envd's requests would be (StartRequest, selectors, signals, SendInput's bytes,
// ListDir's fields). Every refusal must be a ConnectFailure; anything else thrown, a crash or a
// sanitizer report is a finding. Invariant: a message that is read back from an envelope made
// of it is the same bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "service/e2b/connect_wire.hpp"
#include "service/e2b/envd_process.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;

namespace {

std::vector<uint8_t> bytes_of(std::string_view text)
{
    return {text.begin(), text.end()};
}

Seeds make_seeds()
{
    Seeds seeds;
    for (const auto& [name, message] : std::initializer_list<std::pair<const char*, const char*>>{
             {"start", R"({"process":{"cmd":"/bin/bash","args":["-l","-c","ls"],"envs":{"A":"1"},"cwd":"/"},"stdin":false})"},
             {"pty", R"({"process":{"cmd":"/bin/bash"},"pty":{"size":{"cols":"80","rows":24}},"tag":"t"})"},
             {"signal", R"({"process":{"pid":12},"signal":"SIGNAL_SIGKILL"})"},
             {"input", R"({"process":{"tag":"x"},"input":{"stdin":"aGk"}})"},
             {"list", R"({"path":"/tmp","depth":"2","max_entries":1})"},
         })
        seeds.emplace_back(name, bytes_of(connect_envelope(message)));
    return seeds;
}

template <typename Code>
void refused_cleanly(Code&& code)
{
    try {
        code();
    } catch (const ConnectFailure&) {
    }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
    write_seeds_if_asked(make_seeds);
    quiet_logs();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    std::string_view text;
    try {
        text = single_envelope_message(body);
    } catch (const ConnectFailure&) {
        return 0;
    }
    check(single_envelope_message(connect_envelope(text)) == text, "an envelope reads back its message");
    Json message;
    try {
        message = parse_connect_message(text);
    } catch (const ConnectFailure&) {
        return 0;
    }
    refused_cleanly([&] { spawn_request(message, std::chrono::milliseconds(1500)); });
    refused_cleanly([&] { process_selector(MessageReader(message)); });
    refused_cleanly([&] { agent_signal(MessageReader(message)); });
    refused_cleanly([&] {
        const MessageReader reader(message);
        const MessageReader input = reader.message("input", "input");
        (void)input.bytes("stdin", "stdin");
        (void)input.bytes("pty", "pty");
        (void)reader.uint32("depth", "depth");
        (void)reader.int64("maxEntries", "max_entries");
        (void)reader.string_map("envs", "envs");
    });
    return 0;
}
