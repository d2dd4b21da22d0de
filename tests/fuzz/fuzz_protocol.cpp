// Fuzzes the JSON-lines protocol (docs/protocol.md) on both sides of the host:
//  - every line through the agent's request parser (guest/agent/protocol.hpp parse_request),
//    which may only throw RequestError, and through the relay's response summary
//    (protocol/response_scanner.hpp), which must read back the id of every response the protocol
//    code builds, since that is how the relay matches answers to pending calls;
//  - the real episode relay (episode/episode_relay.hpp) on its own event loop: the input's lines
//    are the harness's stdin, except those starting with '<', which are what the agent says
//    (without the '<'). Whatever the relay writes to stdout must be protocol lines.
//
// The input is text; a '\n' ends a line, as on the wire. dict/protocol.dict gives libFuzzer the
// protocol's words.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "episode/episode_relay.hpp"
#include "protocol/response_scanner.hpp"
#include "protocol/agent_protocol.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;

namespace {

// The relay must find `id` again in a response built for it.
void check_response_id(const Json& id)
{
    const std::string line = to_line(error_response(id, "bad_field", "x"));
    const auto summary = summarize_response(line);
    check(summary.has_value(), "an error response is not a JSON object to the relay");
    check(summary->id == id.dump(), "the relay reads another id back from a response");
    check(!summary->is_event, "an error response reads as an event");
}

void check_line(std::string_view line)
{
    try {
        const Request request = parse_request(line);
        check(request.id.is_string() || request.id.is_number(), "a request id that is neither string nor number");
        check_response_id(request.id);
    } catch (const RequestError& e) {
        check(e.id.is_null() || e.id.is_string() || e.id.is_number(), "a refused request's id is not a scalar");
        check(!e.error.code().empty(), "a refused request without an error code");
        check_response_id(e.id);
    }
    summarize_response(line);
}

Fd memfd_with(std::string_view bytes)
{
    Fd fd(::memfd_create("fuzz-protocol", MFD_CLOEXEC));
    check(fd.get() >= 0, "memfd_create");
    check(::write(fd.get(), bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()), "memfd write");
    check(::lseek(fd.get(), 0, SEEK_SET) == 0, "memfd seek");
    return fd;
}

std::string read_all(int fd)
{
    std::string bytes;
    check(::lseek(fd, 0, SEEK_SET) == 0, "memfd seek");
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0)
        bytes.append(buf, static_cast<size_t>(n));
    return bytes;
}

// A line the relay forwarded: the agent's own parser must accept it, since the relay answers
// every line that parser refuses itself. Returns whether it is a close call.
bool check_forwarded(std::string_view line)
{
    try {
        return std::holds_alternative<CloseRequest>(parse_request(line).op);
    } catch (const RequestError&) {
        finding("the relay forwarded a request the agent's parser refuses");
    }
}

// One episode, in a fixed order so that an input always runs the same way: the relay reads
// all of stdin (a regular file holding the harness's lines), forwarding requests to the fake
// agent and answering the rest; once it has half-closed the agent's stream (stdin ended) or
// forwarded a close call, the agent says its lines and hangs up, as the real one does. stdout
// is a regular file too (it never blocks).
void run_relay(const std::string& harness, const std::string& agent_says)
{
    int fds[2];
    check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds) == 0, "socketpair");
    Fd relay_end(fds[0]);
    Fd agent(fds[1]);
    const Fd in = memfd_with(harness);
    const Fd out = memfd_with({});

    // The loop first, then the relay: the relay goes first, as in `agentvm episode`.
    EventLoop loop;
    std::optional<EpisodeRelay::End> end;
    EpisodeRelay relay(loop, in.get(), out.get(), [&](EpisodeRelay::End how, const std::string&) {
        end = how;
        loop.stop();
    });
    std::string forwarded;  // what the agent has read and not yet parsed
    bool agent_listening = true;
    loop.watch_readable(agent.get(), [&] {
        char buf[16384];
        ssize_t n;
        bool close_call = false;
        while ((n = ::read(agent.get(), buf, sizeof(buf))) > 0) {
            forwarded.append(buf, static_cast<size_t>(n));
            size_t nl;
            while (!close_call && (nl = forwarded.find('\n')) != std::string::npos) {
                close_call = check_forwarded(std::string_view(forwarded).substr(0, nl));
                forwarded.erase(0, nl + 1);
            }
        }
        if (n < 0 && !close_call)
            return;  // EAGAIN: more to come
        check(close_call || forwarded.empty(), "the relay forwarded a line without its newline");
        loop.unwatch(agent.get());
        agent_listening = false;
        size_t said = 0;
        while (said < agent_says.size()) {
            n = ::write(agent.get(), agent_says.data() + said, agent_says.size() - said);
            if (n <= 0)
                break;  // the socket is full: this agent says less
            said += static_cast<size_t>(n);
        }
        ::shutdown(agent.get(), SHUT_WR);
    });
    relay.start(std::move(relay_end));
    loop.run();
    check(end.has_value(), "the loop stopped without the relay ending");
    if (agent_listening)
        loop.unwatch(agent.get());
    // Teardown as Vm::run and `agentvm episode` do it: the host's end of the agent's stream
    // goes first, stdout writes stop, in-flight I/O drains, then what is left is written.
    agent = Fd();
    relay.stop_output();
    loop.drain();
    relay.fail_pending("agent_died", "the fuzz agent hung up");
    relay.flush_output();

    const std::string written = read_all(out.get());
    size_t start = 0;
    while (start < written.size()) {
        const size_t nl = written.find('\n', start);
        check(nl != std::string::npos, "the relay wrote a line without its newline");
        const std::string_view line = std::string_view(written).substr(start, nl - start);
        if (!summarize_response(line)) {
            std::fprintf(stderr, "relay output line: %.*s\n", static_cast<int>(line.size()), line.data());
            finding("the relay wrote a line that is not a JSON object");
        }
        start = nl + 1;
    }
}

Seeds make_seeds()
{
    Seeds seeds;
    auto text = [](std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); };
    seeds.emplace_back("exec", text(R"({"id":1,"op":"exec","argv":["ls","-l"],"env":{"A":"b"},"cwd":"/tmp","stdin":"x","timeout":2.5,"max_output":1024,"stream":true}
<{"id":1,"event":"stdout","data":"a"}
<{"id":1,"exit_code":0,"stdout":"","stderr":""}
)"));
    seeds.emplace_back("shell-files", text(R"({"id":"s","op":"shell","cmd":"cd /tmp; pwd","timeout":10}
{"id":2,"op":"write_file","path":"/tmp/a","data_b64":"aGVsbG8=","mode":"0644","append":true}
{"id":3,"op":"read_file","path":"/tmp/a"}
<{"id":"s","exit_code":0,"stdout":"/tmp\n"}
<{"id":2,"ok":true}
{"id":4,"op":"resume","time_ns":1700000000000000000,"entropy_b64":"AAECAwQFBgcICQoLDA0ODxAREhM="}
{"id":5,"op":"close"}
)"));
    seeds.emplace_back("malformed", text(R"({"id":1,"op":"exec","argv":[]}
{"id":1,"op":"exec","argv":["a"]}
{"id":1,"op":"exec","argv":["b"]}
{"op":"exec"}
{"id":[1],"op":"close"}
{"id":7,"op":"exec","argv":["ls"],"timeout":-1}
{"id":8,"op":"write_file","path":"p","data":"a","data_b64":"YQ=="}
{"id":9,"op":"nope"}
not json
<{"error":{"id":3},"id":null}
<[1,2]
)"));
    return seeds;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
    write_seeds_if_asked(make_seeds);
    quiet_logs();
    // As cli/main.cpp does: a peer that went away is an EPIPE to handle, not a signal.
    std::signal(SIGPIPE, SIG_IGN);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    std::string harness;
    std::string agent_says;
    size_t start = 0;
    while (start < input.size()) {
        size_t nl = input.find('\n', start);
        if (nl == std::string_view::npos)
            nl = input.size();
        std::string_view line = input.substr(start, nl - start);
        start = nl + 1;
        if (!line.empty() && line.front() == '<') {
            line.remove_prefix(1);
            agent_says.append(line).push_back('\n');
        } else {
            harness.append(line).push_back('\n');
        }
        check_line(line);
    }
    run_relay(harness, agent_says);
    return 0;
}
