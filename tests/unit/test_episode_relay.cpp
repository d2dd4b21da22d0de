// The episode relay between a harness and the guest agent, with pipes for stdin/stdout and a
// socketpair standing in for the agent: what it forwards, what it answers itself, and how it
// ends. The loop runs on a thread; the test plays harness and agent through the fds.
#include <doctest/doctest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "episode/episode_relay.hpp"
#include "episode/response_stream.hpp"
#include "protocol/response_scanner.hpp"
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
                     std::optional<double> call_timeout_s = std::nullopt, std::string announcement = {},
                     EpisodeRelay::SnapshotHandler snapshot = nullptr, size_t max_request_bytes = max_line_bytes)
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
                      grace, call_timeout_s, max_request_bytes);
        if (snapshot)
            relay->on_snapshot(std::move(snapshot));
        relay->start(Fd(fds[0]), std::move(announcement));
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

TEST_CASE("response scanner: fed in pieces, it knows the id once it is whole, and the line's validity at its end")
{
    ResponseScanner scanner;
    const std::string line = R"({"id":"a \"quoted\" id","exit_code":0,"stdout":"\u0001\ud83d\ude00 é","x":[1.5e3,-0,true,null,{}]})";
    for (size_t at = 0; at < line.size(); ++at) {
        REQUIRE(scanner.feed(line.substr(at, 1)));
        // The id's closing quote is byte 22.
        CHECK(scanner.id().has_value() == (at >= 22));
    }
    auto summary = scanner.finish();
    REQUIRE(summary);
    CHECK(summary->id == R"("a \"quoted\" id")");
    CHECK_FALSE(scanner.id());  // ready for the next line
    // Numbers end at the byte after them, and compare as the request parser spells them.
    REQUIRE(scanner.feed(R"({"id":1.5e3)"));
    CHECK_FALSE(scanner.id());
    REQUIRE(scanner.feed(","));
    CHECK(scanner.id() == summarize_response(R"({"id":1500.0})")->id);
    CHECK_FALSE(scanner.finish());  // the line ended early
    // An id spelled with escapes is still the id; a key named so in a nested object is not.
    CHECK(summarize_response(R"({"\u0069d":5,"\u0065vent":"stdout"})")->id == "5");
    CHECK(summarize_response(R"({"\u0069d":5,"\u0065vent":"stdout"})")->is_event);
    CHECK_FALSE(summarize_response(R"({"x":{"id":5}})")->id);
    // An id longer than the relay tracks is no id.
    CHECK_FALSE(summarize_response(R"({"id":")" + std::string(max_id_bytes, 'a') + R"("})")->id);
    CHECK(summarize_response(R"({"id":")" + std::string(max_id_bytes - 2, 'a') + R"("})")->id);
}

TEST_CASE("response scanner: timed_out and cancelled are seen when the top level says true")
{
    auto s = summarize_response(R"({"id":1,"exit_code":null,"timed_out":true,"stdout":""})");
    REQUIRE(s);
    CHECK(s->timed_out);
    CHECK_FALSE(s->cancelled);
    s = summarize_response(R"({"id":1,"timed_out":false,"c\u0061ncelled":true})");
    REQUIRE(s);
    CHECK_FALSE(s->timed_out);
    CHECK(s->cancelled);
    // Only a literal true, only at the top level; the last duplicate wins, as for nlohmann.
    for (const std::string no : {R"({"id":1,"timed_out":"true"})", R"({"id":1,"timed_out":1})",
                                 R"({"id":1,"timed_out":[true]})", R"({"id":1,"x":{"timed_out":true}})",
                                 R"({"id":1,"timed_out":true,"timed_out":false})"}) {
        CAPTURE(no);
        REQUIRE(summarize_response(no));
        CHECK_FALSE(summarize_response(no)->timed_out);
    }
    CHECK(summarize_response(R"({"timed_out":false,"timed_out":true})")->timed_out);
    // Fed byte by byte, as a long line arrives.
    ResponseScanner scanner;
    for (const char c : std::string(R"({"id":2,"cancelled":true,"stdout":"x"})"))
        REQUIRE(scanner.feed(std::string(1, c)));
    CHECK(scanner.finish()->cancelled);
}

TEST_CASE("response scanner: refuses what nlohmann's parser does not take as an object")
{
    for (const std::string bad :
         {"", " ", "[]", "{", "{}}", "{} x", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":01}", "{\"a\":1.}",
          "{\"a\":.5}", "{\"a\":1e}", "{\"a\":-}", "{\"a\":tru}", "{\"a\":nul1}", "{\"a\":[1,]}", "{\"a\":[1 2]}",
          "{'a':1}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"\\ud800\"}",
          "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud800\\u0041\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xc0\x80\"}",
          "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"a\":\"\xff\"}", "{\"a\":1]"}) {
        CAPTURE(bad);
        CHECK_FALSE((json::accept(bad) && json::parse(bad).is_object()));
        CHECK_FALSE(summarize_response(bad));
    }
    std::string deep = "{\"a\":";
    for (size_t i = 0; i < ResponseScanner::max_depth; ++i)
        deep += "[";
    CHECK_FALSE(summarize_response(deep));
    for (const std::string good : {"{}", " {\"a\" : [ 0 , -1.5E+3, \"\\ud83d\\ude00\\n\\/\" ] } ", "{\"a\":\"\xf0\x9f\x98\x80\"}",
                                   "{\"a\":{\"b\":[[],{}]},\"id\":false}"}) {
        CAPTURE(good);
        CHECK(json::accept(good));
        CHECK(summarize_response(good));
    }
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

TEST_CASE("an announcement is the first line out, before any response")
{
    Harness h(EpisodeRelay::watchdog_grace, std::nullopt, "{\"event\":\"ready\",\"restored\":true}\n");
    h.request(R"({"id":1,"op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"exec","argv":["true"]})");
    h.agent_says(R"({"id":1,"exit_code":0})");
    CHECK(h.response() == R"({"event":"ready","restored":true})");
    CHECK(h.response() == R"({"id":1,"exit_code":0})");
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

TEST_CASE("a harness cannot send resume: it is answered unknown_op and never reaches the agent")
{
    Harness h;
    h.request(R"({"id":"r","op":"resume","time_ns":1,"entropy_b64":"AAECAwQFBgcICQoLDA0ODw==","pids_max":1})");
    const json refused = json::parse(h.response());
    CHECK(refused["id"] == "r");
    CHECK(refused["error"]["code"] == "unknown_op");
    CHECK(refused["error"]["message"].get<std::string>().find("resume") != std::string::npos);
    // The first line the agent ever sees is the request after it.
    h.request(R"({"id":1,"op":"close"})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"close"})");
}

TEST_CASE("a guest's line about no call in flight is dropped, short or long, before or after its call")
{
    Harness h;
    h.agent_says(R"({"id":1,"exit_code":0,"stdout":"before the call was made"})");
    h.request(R"({"id":1,"op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"exec","argv":["true"]})");
    h.agent_says(R"({"id":99,"exit_code":0})");
    h.agent_says(R"({"exit_code":0})");
    // Longer than the stream holds back: decided on by its id before its first byte goes on.
    h.agent_says(R"({"id":98,"event":"stdout","data":")" + std::string(ResponseStream::max_held_line + 10, 'x') +
                 R"("})");
    h.agent_says(R"({"id":1,"event":"stdout","data":"x"})");
    h.agent_says(R"({"id":1,"exit_code":0})");
    h.agent_says(R"({"id":1,"exit_code":7})");  // answered already
    h.request(R"({"id":2,"op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":2,"op":"exec","argv":["true"]})");
    h.agent_says(R"({"id":2,"exit_code":0})");
    CHECK(h.response() == R"({"id":1,"event":"stdout","data":"x"})");
    CHECK(h.response() == R"({"id":1,"exit_code":0})");
    CHECK(h.response() == R"({"id":2,"exit_code":0})");
    CHECK_FALSE(h.end);
}

TEST_CASE("a guest that answers the host's own snapshot call ends the episode, and its answer goes nowhere")
{
    std::function<void(Json)> pending_answer;
    Harness h(EpisodeRelay::watchdog_grace, std::nullopt, {},
              [&](const std::string&, std::function<void(Json)> answer) { pending_answer = std::move(answer); });
    h.request(R"({"id":"s","op":"snapshot","name":"pause-1"})");
    std::this_thread::sleep_for(100ms);
    h.agent_says(R"({"id":"s","snapshot":{"path":"/state/snapshots/.."}})");
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::agent_protocol);
    CHECK(h.why.find("forged") != std::string::npos);
    h.relay->stop_output();
    CHECK(h.relay->fail_pending("agent_died", "gone") == 1);
    h.relay->flush_output();
    const json failed = json::parse(h.response());
    CHECK(failed["id"] == "s");
    CHECK(failed["error"]["code"] == "agent_died");
}

TEST_CASE("snapshot is the host's op: refused without --snapshot-dir, else answered by the episode, never by the agent")
{
    {
        Harness h;
        h.request(R"({"id":"s","op":"snapshot","name":"fork-1"})");
        const json refused = json::parse(h.response());
        CHECK(refused["id"] == "s");
        CHECK(refused["error"]["code"] == "unavailable");
        CHECK(refused["error"]["message"].get<std::string>().find("--snapshot-dir") != std::string::npos);
        h.request(R"({"id":"n","op":"snapshot","name":"../up"})");
        CHECK(error_of(h.response())["code"] == "bad_field");
        h.request(R"({"id":1,"op":"close"})");
        CHECK(h.agent_reads() == R"({"id":1,"op":"close"})");
    }
    std::vector<std::string> names;
    std::function<void(Json)> unanswered;
    Harness h(EpisodeRelay::watchdog_grace, std::nullopt, {},
              [&](const std::string& name, std::function<void(Json)> answer) {
                  names.push_back(name);
                  if (name == "never")
                      unanswered = std::move(answer);
                  else
                      answer(Json{{"snapshot", {{"path", "/s/" + name}}}});
              });
    h.request(R"({"id":7,"op":"snapshot","name":"fork-1"})");
    CHECK(h.response() == R"({"id":7,"snapshot":{"path":"/s/fork-1"}})");
    // Taken once the calls before it have answered; the requests after it wait for it.
    h.request(R"({"id":1,"op":"exec","argv":["sleep","1"]})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"exec","argv":["sleep","1"]})");
    h.request(R"({"id":2,"op":"snapshot","name":"after-1"})" "\n" R"({"id":3,"op":"exec","argv":["true"]})");
    std::this_thread::sleep_for(200ms);
    CHECK(names == std::vector<std::string>{"fork-1"});
    h.agent_says(R"({"id":1,"exit_code":0})");
    CHECK(h.response() == R"({"id":1,"exit_code":0})");
    CHECK(h.response() == R"({"id":2,"snapshot":{"path":"/s/after-1"}})");
    CHECK(h.agent_reads() == R"({"id":3,"op":"exec","argv":["true"]})");
    h.agent_says(R"({"id":3,"exit_code":0})");
    CHECK(h.response() == R"({"id":3,"exit_code":0})");
    // One never answered is pending like any call; what was sent after it waits, and both get
    // an error when the episode ends.
    h.request(R"({"id":8,"op":"snapshot","name":"never"})" "\n" R"({"id":9,"op":"exec","argv":["true"]})");
    std::this_thread::sleep_for(100ms);
    h.agent.reset();
    h.wait_end();
    CHECK(names == std::vector<std::string>{"fork-1", "after-1", "never"});
    h.relay->stop_output();
    CHECK(h.relay->fail_pending("vm_died", "gone") == 2);
    h.relay->flush_output();
    CHECK(json::parse(h.response())["id"] == 8);
    CHECK(json::parse(h.response())["id"] == 9);
}

TEST_CASE("a snapshot waits for the calls before it, but not for an attach or a watch, which run until cancelled")
{
    std::vector<std::string> names;
    Harness h(EpisodeRelay::watchdog_grace, std::nullopt, {},
              [&](const std::string& name, std::function<void(Json)> answer) {
                  names.push_back(name);
                  answer(Json{{"snapshot", {{"path", "/s/" + name}}}});
              });
    h.request(R"({"id":1,"op":"attach","tag":"web"})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"attach","tag":"web"})");
    h.agent_says(R"({"id":1,"event":"attached","pid":7})");
    CHECK(h.response() == R"({"id":1,"event":"attached","pid":7})");
    h.request(R"({"id":2,"op":"exec","argv":["sleep","1"]})");
    CHECK(h.agent_reads() == R"({"id":2,"op":"exec","argv":["sleep","1"]})");
    h.request(R"({"id":3,"op":"snapshot","name":"with-attach"})");
    std::this_thread::sleep_for(200ms);
    CHECK(names.empty());  // the exec is still running
    h.agent_says(R"({"id":2,"exit_code":0})");
    CHECK(h.response() == R"({"id":2,"exit_code":0})");
    CHECK(h.response() == R"({"id":3,"snapshot":{"path":"/s/with-attach"}})");
    CHECK(names == std::vector<std::string>{"with-attach"});
    // The attach goes on after it, as before.
    h.agent_says(R"({"id":1,"event":"stdout","data":"x"})");
    CHECK(h.response() == R"({"id":1,"event":"stdout","data":"x"})");
    h.agent_says(R"({"id":1,"pid":7,"exit_code":0})");
    CHECK(h.response() == R"({"id":1,"pid":7,"exit_code":0})");
    // So does a watch.
    h.request(R"({"id":4,"op":"watch","path":"/work"})");
    CHECK(h.agent_reads() == R"({"id":4,"op":"watch","path":"/work"})");
    h.request(R"({"id":5,"op":"snapshot","name":"with-watch"})");
    CHECK(h.response() == R"({"id":5,"snapshot":{"path":"/s/with-watch"}})");
}

TEST_CASE("a request whose id is longer than the relay tracks is refused")
{
    Harness h;
    const std::string id = std::string(max_id_bytes, 'i');
    h.request(R"({"id":")" + id + R"(","op":"close"})");
    const json refused = json::parse(h.response());
    CHECK(refused["id"] == id);
    CHECK(refused["error"]["code"] == "bad_field");
    h.request(R"({"id":1,"op":"close"})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"close"})");
}

namespace {

// Resident memory of this process in KiB: "VmRSS" now, "VmHWM" the peak since reset_peak_rss().
size_t rss_kib(const std::string& field)
{
    FILE* status = std::fopen("/proc/self/status", "r");
    REQUIRE(status);
    char line[256];
    size_t kib = 0;
    while (std::fgets(line, sizeof(line), status))
        if (std::string_view(line).starts_with(field + ":"))
            kib = std::stoul(line + field.size() + 1);
    std::fclose(status);
    return kib;
}

void reset_peak_rss()
{
    FILE* clear = std::fopen("/proc/self/clear_refs", "w");
    REQUIRE(clear);
    std::fputs("5", clear);
    std::fclose(clear);
}

} // namespace

TEST_CASE("a response of 384 MiB passes through byte for byte while the relay holds a few MiB of it")
{
    // 64 MiB of \x01, the most one stream may carry in an episode, as the agent sends it: valid
    // UTF-8, so a plain string with each byte escaped in six.
    const std::string head = R"({"id":1,"exit_code":0,"signal":null,"stdout":")";
    const std::string tail = R"(","stdout_truncated":false,"stderr":"","duration_ms":1})";
    const std::string escape = "\\u0001";
    const size_t escapes = EpisodeRelay::max_output_limit;
    std::string piece;
    for (size_t i = 0; i < (size_t{1} << 16); ++i)
        piece += escape;
    REQUIRE(escapes % (size_t{1} << 16) == 0);

    Harness h;
    h.request(R"({"id":1,"op":"exec","argv":["true"],"max_output":67108864})");
    CHECK_FALSE(h.agent_reads().empty());
    const size_t before_kib = rss_kib("VmRSS");
    reset_peak_rss();

    std::thread agent([&] {
        write_all(h.agent.get(), head);
        for (size_t done = 0; done < escapes; done += size_t{1} << 16)
            write_all(h.agent.get(), piece);
        write_all(h.agent.get(), tail + "\n");
    });
    // Compared as it arrives, against the line as the agent wrote it.
    const size_t size = head.size() + escapes * escape.size() + tail.size() + 1;
    auto expected = [&](size_t at) {
        if (at < head.size())
            return head[at];
        at -= head.size();
        if (at < escapes * escape.size())
            return escape[at % escape.size()];
        at -= escapes * escape.size();
        return at < tail.size() ? tail[at] : '\n';
    };
    std::string buffer(size_t{1} << 20, '\0');
    size_t got = 0;
    size_t first_difference = size;
    while (got < size) {
        pollfd p{h.out.read.get(), POLLIN, 0};
        REQUIRE(::poll(&p, 1, 30000) == 1);
        const ssize_t n = ::read(h.out.read.get(), buffer.data(), std::min(buffer.size(), size - got));
        REQUIRE(n > 0);
        for (size_t i = 0; i < static_cast<size_t>(n) && first_difference == size; ++i)
            if (buffer[i] != expected(got + i))
                first_difference = got + i;
        got += static_cast<size_t>(n);
    }
    agent.join();
    CHECK(first_difference == size);
    // The call was matched to its answer: the relay frees id 1 once its response has passed,
    // and the line after it is a line of its own.
    h.request(R"({"id":1,"op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"exec","argv":["true"]})");
    h.agent_says(R"({"id":1,"exit_code":0})");
    CHECK(h.response() == R"({"id":1,"exit_code":0})");
    h.request(R"({"id":1,"op":"close"})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"close"})");
    const size_t peak_kib = rss_kib("VmHWM");
    MESSAGE("peak resident memory ", peak_kib / 1024, " MiB, ", before_kib / 1024, " MiB before the response");
#if defined(__SANITIZE_ADDRESS__)
    // AddressSanitizer keeps freed memory in quarantine (256 MiB): the peak says nothing here.
#else
    // The test's own buffers are a few MiB; the relay's out-queue is capped at 16 MiB.
    CHECK(peak_kib < before_kib + 64 * 1024);
#endif
}

namespace {

// The shell call the relay sends ahead of a harness's shell call to export the env.
struct Export {
    json id;
    std::string cmd;
};

Export export_call(const std::string& line)
{
    const json call = json::parse(line);
    CHECK(call["op"] == "shell");
    CHECK(call["id"].get<std::string>().starts_with("agentvm-env-"));
    return {call["id"], call["cmd"].get<std::string>()};
}

std::string answer_to(const json& id, const std::string& rest = R"("exit_code":0)")
{
    return "{\"id\":" + id.dump() + "," + rest + "}";
}

// What `shell -c` prints running `script`.
std::string run_shell(const std::string& shell, const std::string& script)
{
    const std::string path = "/tmp/agentvm-test-export-" + std::to_string(::getpid()) + ".sh";
    FILE* file = std::fopen(path.c_str(), "w");
    REQUIRE(file);
    std::fputs(script.c_str(), file);
    std::fclose(file);
    FILE* out = ::popen((shell + " " + path).c_str(), "r");
    REQUIRE(out);
    std::string text;
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof(buffer), out)) > 0)
        text.append(buffer, n);
    ::pclose(out);
    std::remove(path.c_str());
    return text;
}

} // namespace

TEST_CASE("env is the host's op: validated, answered by the relay, never seen by the agent")
{
    Harness h;
    const std::string many = [] {
        json env = json::object();
        for (int i = 0; i < 257; ++i)
            env["V" + std::to_string(i)] = "x";
        return env.dump();
    }();
    for (const std::string& bad : std::vector<std::string>{
             R"("env":{"1A":"x"})", R"("env":{"A-B":"x"})", R"("env":{"":"x"})", R"("env":{"A\u0000":"x"})",
          R"("env":{"A":"x\u0000y"})", R"("env":{"A":1})", R"("env":{"A":null})", R"("env":["A"])",
          R"("env":"A=1")", "\"env\":{\"" + std::string(257, 'N') + "\":\"x\"}",
          "\"env\":{\"A\":\"" + std::string(size_t{1} << 20, 'x') + "\"}", "\"env\":" + many}) {
        CAPTURE(bad.substr(0, 80));
        h.request(R"({"id":"e","op":"env",)" + bad + "}");
        const json refused = json::parse(h.response());
        CHECK(refused["id"] == "e");
        CHECK(refused["error"]["code"] == "bad_field");
    }
    h.request(R"({"id":"e","op":"env"})");
    CHECK(error_of(h.response())["code"] == "missing_field");
    // At the bounds: 256 variables, names of 256 bytes.
    json most = json::object();
    for (int i = 0; i < 256; ++i)
        most[std::string(250, 'N') + std::to_string(1000 + i)] = "x";
    h.request(json{{"id", "m"}, {"op", "env"}, {"env", most}}.dump());
    CHECK(h.response() == R"({"id":"m","ok":true})");
    h.request(R"({"id":7,"op":"env","env":{"A":"1","_b2":""}})");
    CHECK(h.response() == R"({"id":7,"ok":true})");
    // Its id is checked as any other.
    h.request(R"({"id":"x","op":"exec","argv":["sleep","1"]})");
    h.request(R"({"id":"x","op":"env","env":{}})");
    CHECK(error_of(h.response())["code"] == "bad_field");
    // A refused env leaves the one set before: the first line the agent sees has it merged.
    CHECK(json::parse(h.agent_reads())["env"] == json{{"A", "1"}, {"_b2", ""}});
}

TEST_CASE("env is merged into every exec request after it, the request's own entries winning")
{
    // Request lines bounded at 2 MiB rather than the agent's 64 MiB: the bound is reached
    // the same way, without parsing 64 MiB (minutes under the sanitizers on a loaded host).
    constexpr size_t request_bound = size_t{2} << 20;
    Harness h(EpisodeRelay::watchdog_grace, 600, {}, nullptr, request_bound);
    h.request(R"({"id":0,"op":"exec","argv":["true"]})");
    CHECK(h.agent_reads() == R"({"id":0,"op":"exec","argv":["true"],"timeout":600})");
    h.request(R"({"id":1,"op":"env","env":{"A":"sandbox","B":"sandbox \"quoted\""}})");
    CHECK(h.response() == R"({"id":1,"ok":true})");
    h.request(R"({"id":2,"op":"exec","argv":["env"],"env":{"A":"call","C":"call"},"timeout":5} )");
    const std::string merged = h.agent_reads();
    CHECK(merged == R"({"id":2,"op":"exec","argv":["env"],"env":{"A":"call","C":"call"},"timeout":5,)"
                    R"("env":{"A":"call","B":"sandbox \"quoted\"","C":"call"}} )");
    CHECK(std::get<ExecRequest>(parse_request(merged).op).env
          == std::map<std::string, std::string>{{"A", "call"}, {"B", "sandbox \"quoted\""}, {"C", "call"}});
    h.request(R"({"id":3,"op":"exec","argv":["env"],"env":null})");
    const std::string with_default = h.agent_reads();
    CHECK(std::get<ExecRequest>(parse_request(with_default).op).env
          == std::map<std::string, std::string>{{"A", "sandbox"}, {"B", "sandbox \"quoted\""}});
    CHECK(std::get<ExecRequest>(parse_request(with_default).op).timeout_s == 600);
    // Other ops go unchanged; a second env replaces the first; an empty one clears it.
    h.request(R"({"id":4,"op":"read_file","path":"/x"})");
    CHECK(h.agent_reads() == R"({"id":4,"op":"read_file","path":"/x"})");
    h.request(R"({"id":5,"op":"env","env":{"D":"d"}})");
    CHECK(h.response() == R"({"id":5,"ok":true})");
    h.request(R"({"id":6,"op":"exec","argv":["env"],"timeout":1})");
    CHECK(h.agent_reads() == R"({"id":6,"op":"exec","argv":["env"],"timeout":1,"env":{"D":"d"}})");
    h.request(R"({"id":7,"op":"env","env":{}})");
    CHECK(h.response() == R"({"id":7,"ok":true})");
    h.request(R"({"id":8,"op":"exec","argv":["env"],"timeout":1})");
    CHECK(h.agent_reads() == R"({"id":8,"op":"exec","argv":["env"],"timeout":1})");
    // Merged, a request may not outgrow a request line.
    h.request(R"({"id":9,"op":"env","env":{"E":")" + std::string(1000, 'e') + R"("}})");
    CHECK(h.response() == R"({"id":9,"ok":true})");
    const std::string big = R"({"id":10,"op":"exec","argv":["true"],"timeout":1,"stdin":")";
    std::thread writer([&] { h.request(big + std::string(request_bound - big.size() - 2, 's') + "\"}"); });
    const std::string answer = h.response();
    writer.join();
    const json refused = json::parse(answer);
    CHECK(refused["id"] == 10);
    CHECK(refused["error"]["code"] == "bad_field");
}

TEST_CASE("env is merged into spawn requests as into exec requests, and spawn gets no default timeout")
{
    Harness h(EpisodeRelay::watchdog_grace, 600);
    h.request(R"({"id":1,"op":"env","env":{"A":"sandbox","B":"sandbox"}})");
    CHECK(h.response() == R"({"id":1,"ok":true})");
    h.request(R"({"id":2,"op":"spawn","argv":["server"],"env":{"A":"call"},"tag":"web"})");
    const std::string merged = h.agent_reads();
    CHECK(merged == R"({"id":2,"op":"spawn","argv":["server"],"env":{"A":"call"},"tag":"web","env":{"A":"call","B":"sandbox"}})");
    CHECK(std::get<SpawnRequest>(parse_request(merged).op).command.env
          == std::map<std::string, std::string>{{"A", "call"}, {"B", "sandbox"}});
    // Ops that start no command go unchanged.
    h.request(R"({"id":3,"op":"attach","tag":"web"})");
    CHECK(h.agent_reads() == R"({"id":3,"op":"attach","tag":"web"})");
}

TEST_CASE("env is merged into run_code cells, the cell's own entries winning, and not into a context's creation")
{
    Harness h(EpisodeRelay::watchdog_grace, 600);
    h.request(R"({"id":0,"op":"run_code","code":"1"})");
    CHECK(h.agent_reads() == R"({"id":0,"op":"run_code","code":"1","timeout":600})");
    h.request(R"({"id":1,"op":"env","env":{"A":"sandbox","B":"sandbox"}})");
    CHECK(h.response() == R"({"id":1,"ok":true})");
    h.request(R"({"id":2,"op":"run_code","code":"1","env":{"A":"cell"},"timeout":5})");
    const std::string merged = h.agent_reads();
    CHECK(merged == R"({"id":2,"op":"run_code","code":"1","env":{"A":"cell"},"timeout":5,"env":{"A":"cell","B":"sandbox"}})");
    CHECK(std::get<RunCodeRequest>(parse_request(merged).op).env
          == std::map<std::string, std::string>{{"A", "cell"}, {"B", "sandbox"}});
    h.request(R"({"id":3,"op":"run_code","code":"1","language":"bash"})");
    CHECK(std::get<RunCodeRequest>(parse_request(h.agent_reads()).op).env
          == std::map<std::string, std::string>{{"A", "sandbox"}, {"B", "sandbox"}});
    h.request(R"({"id":4,"op":"create_context","language":"bash"})");
    CHECK(h.agent_reads() == R"({"id":4,"op":"create_context","language":"bash"})");
}

TEST_CASE("env is exported before the first shell call, and again only after one that killed the shell")
{
    Harness h;
    h.request(R"({"id":1,"op":"env","env":{"A":"1"}})");
    CHECK(h.response() == R"({"id":1,"ok":true})");
    h.request(R"({"id":2,"op":"shell","cmd":"echo $A"})");
    const Export first = export_call(h.agent_reads());
    CHECK(first.cmd.find("export A='1'") != std::string::npos);
    CHECK(h.agent_reads() == R"({"id":2,"op":"shell","cmd":"echo $A"})");
    // The export's answer goes nowhere: the next line out is the harness's call's.
    h.agent_says(answer_to(first.id));
    h.agent_says(R"({"id":2,"exit_code":0,"stdout":"1\n"})");
    CHECK(h.response() == R"({"id":2,"exit_code":0,"stdout":"1\n"})");
    // Only the first; an exec call that timed out killed no shell.
    h.request(R"({"id":3,"op":"shell","cmd":"sleep 9","timeout":1})");
    CHECK(h.agent_reads() == R"({"id":3,"op":"shell","cmd":"sleep 9","timeout":1})");
    h.request(R"({"id":4,"op":"exec","argv":["sleep","9"],"timeout":1})");
    CHECK(json::parse(h.agent_reads())["id"] == 4);
    h.agent_says(R"({"id":4,"exit_code":null,"timed_out":true})");
    CHECK(json::parse(h.response())["id"] == 4);
    h.agent_says(R"({"id":3,"exit_code":null,"timed_out":false})");
    CHECK(json::parse(h.response())["id"] == 3);
    h.request(R"({"id":5,"op":"shell","cmd":"sleep 9","timeout":1})");
    CHECK(h.agent_reads() == R"({"id":5,"op":"shell","cmd":"sleep 9","timeout":1})");
    // A shell call that timed out: the next shell call gets the export again.
    h.agent_says(R"({"id":5,"exit_code":null,"signal":9,"timed_out":true})");
    CHECK(json::parse(h.response())["id"] == 5);
    h.request(R"({"id":6,"op":"shell","cmd":"sleep 9"})");
    const Export second = export_call(h.agent_reads());
    CHECK(second.id != first.id);
    CHECK(second.cmd == first.cmd);
    CHECK(h.agent_reads() == R"({"id":6,"op":"shell","cmd":"sleep 9"})");
    h.agent_says(answer_to(second.id));
    // One that was cancelled: again.
    h.agent_says(R"({"id":6,"exit_code":null,"timed_out":false,"cancelled":true})");
    CHECK(json::parse(h.response())["id"] == 6);
    h.request(R"({"id":7,"op":"shell","cmd":"true"})");
    const Export third = export_call(h.agent_reads());
    CHECK(h.agent_reads() == R"({"id":7,"op":"shell","cmd":"true"})");
    // The export killed too (a harness may cancel it by id): again.
    h.agent_says(answer_to(third.id, R"("exit_code":null,"cancelled":true)"));
    h.agent_says(R"({"id":7,"exit_code":0})");
    CHECK(h.response() == R"({"id":7,"exit_code":0})");
    h.request(R"({"id":8,"op":"shell","cmd":"true"})");
    const Export fourth = export_call(h.agent_reads());
    CHECK(h.agent_reads() == R"({"id":8,"op":"shell","cmd":"true"})");
    // While it runs its id is taken; then it is free.
    h.request(R"({"id":)" + fourth.id.dump() + R"(,"op":"exec","argv":["true"]})");
    CHECK(error_of(h.response())["code"] == "bad_field");
    h.agent_says(answer_to(fourth.id));
    h.agent_says(R"({"id":8,"exit_code":0})");
    CHECK(h.response() == R"({"id":8,"exit_code":0})");
    // A new env is exported again, before the next shell call.
    h.request(R"({"id":9,"op":"env","env":{"B":"2"}})");
    CHECK(h.response() == R"({"id":9,"ok":true})");
    h.request(R"({"id":10,"op":"shell","cmd":"true"})");
    CHECK(export_call(h.agent_reads()).cmd.find("export B='2'") != std::string::npos);
    CHECK(h.agent_reads() == R"({"id":10,"op":"shell","cmd":"true"})");
    CHECK_FALSE(h.end);
}

TEST_CASE("without an env no shell call is sent ahead, and a killed shell changes nothing")
{
    Harness h;
    h.request(R"({"id":1,"op":"shell","cmd":"true","timeout":1})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"shell","cmd":"true","timeout":1})");
    h.agent_says(R"({"id":1,"exit_code":null,"timed_out":true})");
    CHECK(json::parse(h.response())["id"] == 1);
    h.request(R"({"id":2,"op":"env","env":{}})");
    CHECK(h.response() == R"({"id":2,"ok":true})");
    h.request(R"({"id":3,"op":"shell","cmd":"true"})");
    CHECK(h.agent_reads() == R"({"id":3,"op":"shell","cmd":"true"})");
}

TEST_CASE("a guest that sends an event about the host's export call ends the episode, and it goes nowhere")
{
    Harness h;
    h.request(R"({"id":1,"op":"env","env":{"A":"1"}})");
    CHECK(h.response() == R"({"id":1,"ok":true})");
    h.request(R"({"id":2,"op":"shell","cmd":"true"})");
    const Export call = export_call(h.agent_reads());
    CHECK_FALSE(h.agent_reads().empty());
    h.agent_says(answer_to(call.id, R"("event":"stdout","data":"x")"));
    h.wait_end();
    REQUIRE(h.end);
    CHECK(*h.end == EpisodeRelay::End::agent_protocol);
    CHECK(h.why.find("forged") != std::string::npos);
    // Only the harness's call is failed: the export was never the harness's.
    h.relay->stop_output();
    CHECK(h.relay->fail_pending("agent_died", "gone") == 1);
    h.relay->flush_output();
    CHECK(json::parse(h.response())["id"] == 2);
}

TEST_CASE("the export sets the env exactly in bash and sh, and a shell that has it already keeps its own changes")
{
    Harness h;
    const json env = {{"A", "it's \"quoted\" $HOME `x` \\ \n new line"}, {"B", ""}, {"C", "\xc3\xa9"}};
    h.request(json{{"id", 1}, {"op", "env"}, {"env", env}}.dump());
    CHECK(h.response() == R"({"id":1,"ok":true})");
    h.request(R"({"id":2,"op":"shell","cmd":"true"})");
    const std::string cmd = export_call(h.agent_reads()).cmd;
    for (const std::string shell : {"bash --noprofile --norc", "sh"}) {
        CAPTURE(shell);
        // Exported to commands, byte for byte.
        CHECK(run_shell(shell, cmd + "\nprintf '%s|%s|%s' \"$A\" \"$B\" \"$C\"; env | grep -c '^B=$'")
              == env["A"].get<std::string>() + "||\xc3\xa9" + "1\n");
        // Run again in a shell that has it (a fork's), it undoes nothing; nor is its marker
        // exported.
        CHECK(run_shell(shell, cmd + "\nunset A; C=mine\n" + cmd + "\nprintf '%s|%s' \"${A-unset}\" \"$C\"; env | grep -c agentvm")
              == "unset|mine0\n");
    }
}

TEST_CASE("run_code in a context gets the episode's default timeout too; the context ops go unchanged")
{
    Harness h(50ms, 600);
    h.request(R"({"id":1,"op":"run_code","code":"pwd","context":"ctx-1","language":"bash"})");
    CHECK(h.agent_reads() == R"({"id":1,"op":"run_code","code":"pwd","context":"ctx-1","language":"bash","timeout":600})");
    h.request(R"({"id":2,"op":"create_context","language":"bash","cwd":"/tmp"})");
    CHECK(h.agent_reads() == R"({"id":2,"op":"create_context","language":"bash","cwd":"/tmp"})");
    h.request(R"({"id":3,"op":"restart_context","context":"ctx-1"})");
    CHECK(h.agent_reads() == R"({"id":3,"op":"restart_context","context":"ctx-1"})");
    // A malformed one is the relay's to answer, as any request's.
    h.request(R"({"id":4,"op":"run_code","code":"1","context":""})");
    CHECK(error_of(h.response())["code"] == "bad_field");
}
