#include "episode/bake_calls.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace agentvm {
namespace {

constexpr const char* close_id = "agentvm-bake";
// How much of a line that is not an answer a message quotes.
constexpr size_t quoted_bytes = 300;

// A field of the guest's answer only when it has the type asked for: the answer is the
// guest's, and nlohmann's value() throws on another type.
std::string string_field(const Json& object, const char* key)
{
    const auto it = object.find(key);
    return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

bool true_field(const Json& object, const char* key)
{
    const auto it = object.find(key);
    return it != object.end() && it->is_boolean() && it->get<bool>();
}

Json any_field(const Json& object, const char* key)
{
    const auto it = object.find(key);
    return it == object.end() ? Json() : *it;
}

} // namespace

// Ours load what every tool call needs (the agent's exec path, bash, libc) into the guest's
// page cache and caches, so that the snapshot holds them and restored VMs neither read them
// from disk nor dirty pages loading them. The first of ours runs alone, under KVM's dirty
// log: the pages it writes are the snapshot's warm pages (vmm/warm_pages.hpp), those a
// restored VM's first call writes. The shell session's pages are left out: they are many, and
// an idle VM would carry them all (measured in the test host: 868 warm pages with it, idle VMs
// 4.1 MiB private instead of the 3 MiB we allow).
std::vector<BakeCall> bake_calls(const std::vector<std::string>& run, const std::vector<std::string>& warm_up,
                                 double step_timeout_s)
{
    std::vector<BakeCall> calls;
    const auto add_steps = [&](const std::vector<std::string>& commands, const char* flag) {
        for (size_t i = 0; i < commands.size(); ++i)
            calls.push_back({Json{{"id", fmt::format("agentvm{}-{}", flag, i + 1)},
                                  {"op", "exec"},
                                  {"argv", {"/bin/sh", "-c", commands[i]}},
                                  {"timeout", step_timeout_s},
                                  {"max_output", bake_step_output_bytes}},
                             fmt::format("{} {} ({})", flag, i + 1, commands[i].substr(0, 80))});
    };
    add_steps(run, "--run");
    add_steps(warm_up, "--warm-up");
    calls.push_back(
        {Json{{"id", "agentvm-warm-exec"}, {"op", "exec"}, {"argv", {"true"}}}, "the warm-up exec", true, false, true});
    calls.push_back({Json{{"id", "agentvm-warm-shell"}, {"op", "shell"}, {"cmd", "true"}}, "the warm-up shell call", false,
                     false, true});
    calls.push_back({Json{{"id", close_id}, {"op", "close"}}, "close", false, true});
    return calls;
}

std::string failure_of(const BakeCall& call, const std::string& line)
{
    const Json answer = Json::parse(line, nullptr, false);
    if (!answer.is_object() || any_field(answer, "id") != call.call["id"])
        return fmt::format("the guest agent answered {} with something else: {}", call.what,
                           line.substr(0, quoted_bytes));
    if (call.closes)
        return true_field(answer, "ok") ? "" : "the guest agent did not close: " + line.substr(0, quoted_bytes);
    if (answer.contains("error")) {
        const Json& error = answer["error"];
        const bool object = error.is_object();
        if (call.may_be_missing && object && string_field(error, "code") == "not_found") {
            spdlog::info("{} skipped: {}", call.what, string_field(error, "message"));
            return "";
        }
        return fmt::format("{} failed in the guest: {}", call.what, error.dump().substr(0, 4 * quoted_bytes));
    }
    if (any_field(answer, "exit_code") == 0)
        return "";
    const auto text = [&](const char* stream) {
        const std::string said = string_field(answer, stream);
        return said.empty() ? "" : fmt::format("\n{}:\n{}", stream, said);
    };
    return fmt::format("{} failed in the guest: exit code {}, signal {}{}{}{}", call.what,
                       any_field(answer, "exit_code").dump(), any_field(answer, "signal").dump(),
                       true_field(answer, "timed_out") ? " (timed out)" : "", text("stdout"), text("stderr"));
}

} // namespace agentvm
