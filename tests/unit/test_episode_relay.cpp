// The episode relay between a harness and the guest agent, with pipes for stdin/stdout and a
// socketpair standing in for the agent: what it forwards, what it answers itself, and how it
// ends. The loop runs on a thread; the test plays harness and agent through the fds.
#include <doctest/doctest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/episode_relay.hpp"
#include "cli/response_summary.hpp"
#include "protocol/agent_protocol.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

using namespace agentvm;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct Pipe {
    Fd read;
    Fd write;
};

Pipe make_pipe()
{
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    return {Fd(fds[0]), Fd(fds[1])};
}

// Reads one '\n'-terminated line from fd (blocking, 10 s at most); "" on timeout or EOF.
std::string read_line(int fd)
{
    std::string line;
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 10000) != 1)
            return "";
        char c = 0;
        if (::read(fd, &c, 1) != 1)
            return "";
        if (c == '\n')
            return line;
        line.push_back(c);
    }
}

void write_all(int fd, const std::string& bytes)
{
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        REQUIRE(n > 0);
        done += static_cast<size_t>(n);
    }
}

// True when fd reaches end-of-file (with nothing before it) within 10 s.
bool reaches_eof(int fd)
{
    pollfd p{fd, POLLIN, 0};
    char c = 0;
    return ::poll(&p, 1, 10000) == 1 && ::read(fd, &c, 1) == 0;
}

struct Harness {
    EventLoop loop;
    Pipe in = make_pipe();    // harness -> relay
    Pipe out = make_pipe();   // relay -> harness
    Fd agent;                 // the fake agent's end
    std::optional<EpisodeRelay::End> end;
    std::string why;
    std::optional<EpisodeRelay> relay;
    std::thread thread;

    explicit Harness(std::chrono::milliseconds grace = EpisodeRelay::watchdog_grace,
                     std::optional<double> call_timeout_s = std::nullopt)
    {
        int fds[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
        agent = Fd(fds[1]);
        relay.emplace(loop, in.read.get(), out.write.get(),
                      [this](EpisodeRelay::End how, const std::string& text) {
                          end = how;
                          why = text;
                          loop.stop();
                      },
                      grace, call_timeout_s);
        relay->start(Fd(fds[0]));
        thread = std::thread([this] { loop.run(); });
    }

    ~Harness()
    {
        loop.stop();
        thread.join();
    }

    void wait_end()
    {
        thread.join();
        thread = std::thread([] {});
    }

    // After wait_end: runs the loop again for a while and waits for it.
    void turn(std::chrono::milliseconds how_long)
    {
        thread.join();
        thread = std::thread([this, how_long] {
            std::thread stopper([this, how_long] {
                std::this_thread::sleep_for(how_long);
                loop.stop();
            });
            loop.run();
            stopper.join();
        });
        thread.join();
        thread = std::thread([] {});
    }

    void request(const std::string& line) { write_all(in.write.get(), line + "\n"); }
    std::string response() { return read_line(out.read.get()); }
    std::string agent_reads() { return read_line(agent.get()); }
    void agent_says(const std::string& line) { write_all(agent.get(), line + "\n"); }
};

json error_of(const std::string& line)
{
    return json::parse(line).at("error");
}

} // namespace

TEST_CASE("response summary: id as compact JSON, events told apart, nested ids ignored")
{
    auto s = summarize_response(R"({"id":7,"exit_code":0,"stdout":"x"})");
    REQUIRE(s);
    CHECK(s->id == "7");
    CHECK_FALSE(s->is_event);
    s = summarize_response(R"({"event":"stdout","data":"a","id":"x y"})");
    REQUIRE(s);
    CHECK(s->id == "\"x y\"");
    CHECK(s->is_event);
    s = summarize_response(R"({"error":{"id":3,"code":"io"},"id":null})");
    REQUIRE(s);
    CHECK(s->id == "null");
    s = summarize_response(R"({"id":{"a":1},"ok":true})");
    REQUIRE(s);
    CHECK_FALSE(s->id);
    CHECK_FALSE(summarize_response("[1]"));
    CHECK_FALSE(summarize_response("{\"id\":1"));
    CHECK_FALSE(summarize_response("not json"));
}

TEST_CASE("leading id: the id of a line still arriving, once it has arrived whole")
{
    CHECK(leading_id(R"({"id":7,"exit_code":0,"stdout":"xx)") == "7");
    CHECK(leading_id(R"({"id":"a \"quoted\" id","ev)") == R"("a \"quoted\" id")");
    CHECK(leading_id(R"({"id":1.5e3,)") == summarize_response(R"({"id":1.5e3})")->id);
    // Not yet whole: a number may go on, a string has no closing quote.
    CHECK_FALSE(leading_id(R"({"id":7)"));
    CHECK_FALSE(leading_id(R"({"id":"abc)"));
    CHECK_FALSE(leading_id(R"({"id":"abc\")"));
    CHECK_FALSE(leading_id(R"({"id")"));
    // Not the agent's shape.
    CHECK_FALSE(leading_id(R"({"event":"stdout","id":7,)"));
    CHECK_FALSE(leading_id(R"({"id":{"a":1},)"));
    CHECK_FALSE(leading_id(R"({"id":-,)"));
    CHECK_FALSE(leading_id(R"({"id":true,)"));
    CHECK_FALSE(leading_id(""));
}

TEST_CASE("requests go to the agent byte for byte, and its lines come back byte for byte")
{
    Harness h;
    const std::string request = R"({"id":1, "op":"exec", "argv":["echo","hi"], "stream":true})";
    h.request(request);
    CHECK(h.agent_reads() == request);
    h.agent_says(R"({"id":1,"event":"stdout","data":"hi\n"})");
    h.agent_says(R"({"id":1,"exit_code":0,"stdout":"hi\n"})");
    CHECK(h.response() == R"({"id":1,"event":"stdout","data":"hi\n"})");
    CHECK(h.response() == R"({"id":1,"exit_code":0,"stdout":"hi\n"})");
}

TEST_CASE("malformed lines are answered by the relay and never reach the agent")
{
    Harness h;
    h.request("hello");
    CHECK(error_of(h.response())["code"] == "bad_json");
    h.request(R"({"op":"exec","argv":["true"]})");
    CHECK(error_of(h.response())["code"] == "missing_field");
    h.request(R"({"id":"u","op":"reboot"})");
    const json unknown = json::parse(h.response());
    CHECK(unknown["id"] == "u");
    CHECK(unknown["error"]["code"] == "unknown_op");
    h.request(R"({"id":2,"op":"exec","argv":["true"],"max_output":100000000})");
    CHECK(error_of(h.response())["code"] == "bad_field");
    h.request("   ");
    // The first line the agent ever sees is the first valid request.
    h.request(R"({"id":3,"op":"read_file","path":"/etc/hostname"})");
    CHECK(h.agent_reads() == R"({"id":3,"op":"read_file","path":"/etc/hostname"})");
}

TEST_CASE("an over-long request line is answered line_too_long and skipped")
{
    Harness h;
    std::thread writer([&] {
        h.request(std::string(max_line_bytes + 1, 'x'));
        h.request(R"({"id":1,"op":"close"})");
    });
    const json too_long = json::parse(h.response());
    writer.join();
    CHECK(too_long["id"].is_null());
    CHECK(too_long["error"]["code"] == "line_too_long");
    CHECK(h.agent_reads() == R"({"id":1,"op":"close"})");
}

TEST_CASE("an id is refused while its call is pending, and free again once it has answered")
{
    Harness h;
    h.request(R"({"id":"a","op":"exec","argv":["sleep","1"]})");
    CHECK(h.agent_reads() == R"({"id":"a","op":"exec","argv":["sleep","1"]})");
    h.request(R"({"id":"a","op":"exec","argv":["true"]})");
    const json dup = json::parse(h.response());
    CHECK(dup["id"] == "a");
    CHECK(dup["error"]["code"] == "bad_field");
    // Events do not end a call; the final response does.
    h.agent_says(R"({"id":"a","event":"stdout","data":"x"})");
    CHECK(h.response() == R"({"id":"a","event":"stdout","data":"x"})");
    h.agent_says(R"({"id":"a","exit_code":0})");
    CHECK(h.response() == R"({"id":"a","exit_code":0})");
    h.request(R"({"id":"a","op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":"a","op":"exec","argv":["true"]})");
}

TEST_CASE("end of input half-closes toward the agent; the episode ends once all is answered")
{
    Harness h;
    h.request(R"({"id":1,"op":"exec","argv":["true"]})");
    h.in.write.reset();
    CHECK(h.agent_reads() == R"({"id":1,"op":"exec","argv":["true"]})");
    CHECK(reaches_eof(h.agent.get()));
    h.agent_says(R"({"id":1,"exit_code":0})");
    CHECK(h.response() == R"({"id":1,"exit_code":0})");
    h.agent.reset();
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::finished);
}

TEST_CASE("the agent going away with calls pending ends the episode; each pending call gets an error")
{
    Harness h;
    h.request(R"({"id":1,"op":"exec","argv":["sleep","9"]})");
    h.request(R"({"id":"two","op":"shell","cmd":"sleep 9"})");
    h.request(R"({"id":3,"op":"exec","argv":["true"]})");
    for (int i = 0; i < 3; ++i)
        CHECK_FALSE(h.agent_reads().empty());
    h.agent_says(R"({"id":3,"exit_code":0})");
    CHECK(h.response() == R"({"id":3,"exit_code":0})");
    h.agent.reset();
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::agent_lost);
    CHECK(h.why.find("2 call(s)") != std::string::npos);
    h.relay->stop_output();
    CHECK(h.relay->fail_pending("agent_died", "gone") == 2);
    h.relay->flush_output();
    const json a = json::parse(h.response());
    const json b = json::parse(h.response());
    CHECK(a["id"] == 1);
    CHECK(b["id"] == "two");
    CHECK(a["error"]["code"] == "agent_died");
    CHECK(b["error"]["message"] == "gone");
}

TEST_CASE("a call that outlives its timeout by the grace period trips the watchdog")
{
    Harness h(50ms);
    h.request(R"({"id":1,"op":"exec","argv":["sleep","9"],"timeout":0.05})");
    CHECK_FALSE(h.agent_reads().empty());
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::watchdog);
    CHECK(h.why.find("call 1") != std::string::npos);
}

TEST_CASE("a line from the agent that is not a JSON object ends the episode")
{
    Harness h;
    h.agent_says("garbage");
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::agent_protocol);
}

TEST_CASE("a call whose answer is still arriving never trips the watchdog; a silent one still does")
{
    Harness h(200ms);
    h.request(R"({"id":1,"op":"exec","argv":["cat","/dev/zero"],"timeout":0.05})");
    CHECK_FALSE(h.agent_reads().empty());
    // The answer comes slowly, well past timeout + grace, but a piece every 100 ms; events
    // of the call count as much as a long line in pieces.
    h.agent_says(R"({"id":1,"event":"stdout","data":"x"})");
    std::this_thread::sleep_for(150ms);
    write_all(h.agent.get(), R"({"id":1,"exit_code":null,"stdout":")");
    for (int i = 0; i < 10; ++i) {
        std::this_thread::sleep_for(100ms);
        write_all(h.agent.get(), std::string(1000, 'y'));
    }
    write_all(h.agent.get(), "\"}\n");
    CHECK(h.response() == R"({"id":1,"event":"stdout","data":"x"})");
    CHECK(h.response().size() > 10000);
    CHECK_FALSE(h.end);

    // Another call's answer arriving does not vouch for a call that stays silent.
    h.request(R"({"id":2,"op":"exec","argv":["sleep","9"],"timeout":0.05})");
    h.request(R"({"id":3,"op":"exec","argv":["cat","/dev/zero"]})");
    CHECK_FALSE(h.agent_reads().empty());
    CHECK_FALSE(h.agent_reads().empty());
    write_all(h.agent.get(), R"({"id":3,"exit_code":null,"stdout":")");
    const auto start = std::chrono::steady_clock::now();
    while (!h.end && std::chrono::steady_clock::now() - start < 5s) {
        std::this_thread::sleep_for(50ms);
        write_all(h.agent.get(), std::string(100, 'y'));
    }
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::watchdog);
    CHECK(h.why.find("call 2") != std::string::npos);
}

TEST_CASE("exec and shell calls without a timeout get the episode's default; the watchdog counts from it")
{
    Harness h(50ms, 600);
    h.request(R"({"id":1,"op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"exec","argv":["true"],"timeout":600})");
    h.request(R"({"id":2, "op":"shell", "cmd":"true"}  )");
    CHECK(h.agent_reads() == R"({"id":2, "op":"shell", "cmd":"true","timeout":600}  )");
    // null is no timeout to the agent: the default, last, overrides it.
    h.request(R"({"id":3,"op":"exec","argv":["true"],"timeout":null})");
    const std::string with_null = h.agent_reads();
    CHECK(with_null == R"({"id":3,"op":"exec","argv":["true"],"timeout":null,"timeout":600})");
    CHECK(std::get<ExecRequest>(parse_request(with_null).op).timeout_s == 600);
    // A call's own timeout, and other ops, go unchanged.
    h.request(R"({"id":4,"op":"exec","argv":["true"],"timeout":5})");
    CHECK(h.agent_reads() == R"({"id":4,"op":"exec","argv":["true"],"timeout":5})");
    h.request(R"({"id":5,"op":"read_file","path":"/x"})");
    CHECK(h.agent_reads() == R"({"id":5,"op":"read_file","path":"/x"})");
}

TEST_CASE("a call without a timeout that the agent never answers trips the watchdog at the default")
{
    Harness h(50ms, 0.05);
    h.request(R"({"id":"spin","op":"exec","argv":["python3","-c","while True: pass"]})");
    CHECK_FALSE(h.agent_reads().empty());
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::watchdog);
}

TEST_CASE("once the VM is stopping, the agent's connection ending is not reported as the cause")
{
    Harness h;
    h.request(R"({"id":1,"op":"exec","argv":["sleep","9"]})");
    CHECK_FALSE(h.agent_reads().empty());
    // The VM failed on its own (its loop stops), then its streams are shut down.
    h.loop.stop();
    h.wait_end();
    h.relay->stop_output();
    h.agent.reset();
    h.turn(100ms);
    CHECK_FALSE(h.end);
    CHECK(h.relay->fail_pending("vm_died", "the VM failed") == 1);
}
