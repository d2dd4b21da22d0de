// HttpServer's streamed request bodies, paused and resumed piece by piece while the client sends
// a chunked body in one write: MHD 0.9.75 hands the handler the next chunk even after it
// suspended the connection, and a second suspend corrupted MHD's connection lists (serve
// crashed in MHD_run under the E2B tier's uploads). Every byte must arrive once, in order, and
// the server must go on serving.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/http_server.hpp"
#include "service/native/native_wire.hpp"
#include "tests/support/loop_with_client.hpp"

using namespace agentvm;

namespace {

// Sends `request` on a new connection to `socket_path` in one write and returns the answer.
std::string exchange_over(const std::string& socket_path, const std::string& request)
{
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    socket_path.copy(address.sun_path, sizeof address.sun_path - 1);
    std::string answer;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0
        && ::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
        char buffer[4096];
        for (ssize_t got; (got = ::read(fd, buffer, sizeof buffer)) > 0;)
            answer.append(buffer, static_cast<size_t>(got));
    }
    ::close(fd);
    return answer;
}

} // namespace

TEST_CASE("a chunked body paused after every piece arrives whole, and the server serves on")
{
    char dir_name[] = "/tmp/agentvm-body-pause-XXXXXX";
    REQUIRE(::mkdtemp(dir_name) != nullptr);
    const std::string socket_path = std::string(dir_name) + "/sock";
    EventLoop loop;
    std::vector<Fd> listeners;
    listeners.push_back(listen_unix(socket_path));

    std::string received;
    size_t pieces = 0;
    // Each piece pauses the body; a timer resumes it a moment later, as a file writer waiting
    // for the guest does.
    std::shared_ptr<HttpExchange> paused;
    LoopTimer resume(loop, [&] {
        if (auto exchange = std::exchange(paused, nullptr))
            exchange->resume_body();
    });
    HttpServer::Options options;
    options.admit = [&](HttpExchange& exchange) {
        HttpServer::Admission admission;
        admission.errors = &native_errors();
        admission.streams_body = exchange.path() == "/upload";
        admission.handler = [&](const std::shared_ptr<HttpExchange>& ex) {
            if (ex->path() != "/upload")
                return ex->respond(200, R"({"still":"serving"})");
            ex->read_body(
                [&, ex](std::string_view piece) {
                    received.append(piece);
                    ++pieces;
                    ex->pause_body();
                    paused = ex;
                    resume.arm(std::chrono::milliseconds(1));
                },
                [&, ex] { ex->respond(200, fmt::format(R"({{"bytes":{}}})", received.size())); });
        };
        return admission;
    };
    HttpServer server(loop, std::move(listeners), options);

    std::string sent;
    std::string request = "POST /upload HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 300; ++i) {
        const std::string chunk = fmt::format("{:05}", i);
        sent += chunk;
        request += fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk);
    }
    request += "0\r\n\r\n";

    std::string upload_answer;
    std::string later_answer;
    test::run_loop_with_client(loop, [&] {
        upload_answer = exchange_over(socket_path, request);
        later_answer = exchange_over(socket_path, "GET /other HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    });
    std::filesystem::remove_all(dir_name);

    CHECK(upload_answer.starts_with("HTTP/1.1 200"));
    CHECK(upload_answer.ends_with(fmt::format(R"({{"bytes":{}}})", sent.size())));
    CHECK(received == sent);
    CHECK(pieces > 1);
    CHECK(later_answer.ends_with(R"({"still":"serving"})"));
}
