// envd's /files, the parts without a sandbox: who may read and write (file_access.hpp: the
// X-Access-Token, or the URL signature the SDKs' downloadUrl()/uploadUrl() make), and a
// multipart/form-data body read through libmicrohttpd's post processor (multipart_body.hpp),
// served by a real HttpServer on a Unix socket to a client that sends crafted bodies.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include <nettle/sha2.h>

#include "common/base64.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/e2b/e2b_errors.hpp"
#include "service/e2b/file_access.hpp"
#include "service/e2b/multipart_body.hpp"
#include "service/http_server.hpp"
#include "tests/support/loop_with_client.hpp"

using namespace agentvm;

namespace {

// The SDK's getSignature(), written out here from its definition rather than through
// SandboxTokens::file_signature, so that the two are checked against each other.
std::string sdk_signature(const std::string& raw)
{
    sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, raw.size(), reinterpret_cast<const uint8_t*>(raw.data()));
    std::string digest(SHA256_DIGEST_SIZE, '\0');
    sha256_digest(&ctx, digest.size(), reinterpret_cast<uint8_t*>(digest.data()));
    std::string encoded = base64_encode(digest);
    while (encoded.ends_with('='))
        encoded.pop_back();
    return "v1_" + encoded;
}

FileAccess signed_access(const std::string& signature, std::optional<std::string> expiration)
{
    FileAccess access;
    access.signature = signature;
    access.signature_expiration = std::move(expiration);
    access.path = "/home/user/a.txt";
    access.user = "user";
    access.operation = "read";
    return access;
}

} // namespace

TEST_CASE("X-Access-Token opens its own sandbox's files and no other's")
{
    const SandboxTokens tokens("");
    FileAccess access;
    access.path = "/a";
    access.operation = "write";
    access.access_token = tokens.envd_token("sb-1");
    CHECK(!file_access_refusal(tokens, "sb-1", access, 0));
    CHECK(file_access_refusal(tokens, "sb-2", access, 0));
    // A wrong token is refused even beside a good signature, as envd does.
    access.access_token = "nope";
    access.signature = tokens.file_signature("sb-1", "/a", "write", "", 0);
    CHECK(file_access_refusal(tokens, "sb-1", access, 0));
    access.access_token.reset();
    access.signature.reset();
    CHECK(file_access_refusal(tokens, "sb-1", access, 0));
}

TEST_CASE("a signed URL opens the path, operation and user it was signed for, until it expires")
{
    const SandboxTokens tokens("");
    const std::string token = tokens.envd_token("sb-1");
    const long long now = 1767225600;
    const std::string expiry = std::to_string(now + 60);

    const std::string with_expiry = sdk_signature("/home/user/a.txt:read:user:" + token + ":" + expiry);
    CHECK(!file_access_refusal(tokens, "sb-1", signed_access(with_expiry, expiry), now));
    // Past its expiry; with another expiry than the signed one; without the expiry.
    CHECK(file_access_refusal(tokens, "sb-1", signed_access(with_expiry, expiry), now + 61));
    CHECK(file_access_refusal(tokens, "sb-1", signed_access(with_expiry, std::to_string(now + 3600)), now));
    CHECK(file_access_refusal(tokens, "sb-1", signed_access(with_expiry, std::nullopt), now));
    // Another sandbox, operation, path or user.
    CHECK(file_access_refusal(tokens, "sb-2", signed_access(with_expiry, expiry), now));
    FileAccess write = signed_access(with_expiry, expiry);
    write.operation = "write";
    CHECK(file_access_refusal(tokens, "sb-1", write, now));
    FileAccess other_path = signed_access(with_expiry, expiry);
    other_path.path = "/home/user/b.txt";
    CHECK(file_access_refusal(tokens, "sb-1", other_path, now));
    FileAccess no_user = signed_access(with_expiry, expiry);
    no_user.user = "";
    CHECK(file_access_refusal(tokens, "sb-1", no_user, now));

    const std::string forever = sdk_signature("/home/user/a.txt:read:user:" + token);
    CHECK(!file_access_refusal(tokens, "sb-1", signed_access(forever, std::nullopt), now));
    CHECK(file_access_refusal(tokens, "sb-1", signed_access(forever, "0"), now));
    CHECK(file_access_refusal(tokens, "sb-1", signed_access(forever, "soon"), now));
    CHECK(file_access_refusal(tokens, "sb-1", signed_access(forever, "-1"), now));
}

namespace {

struct Seen {
    bool opened = false;
    bool malformed = false;
    bool whole = false;
    std::vector<MultipartBody::Part> parts;
    std::vector<std::string> data;
};

// Serves one request on a fresh HttpServer, its body read through a MultipartBody, and
// returns the raw HTTP answer.
std::string serve_one(const std::string& content_type, const std::string& body, Seen& seen, size_t write_bytes = 0)
{
    char dir_name[] = "/tmp/agentvm-multipart-XXXXXX";
    REQUIRE(::mkdtemp(dir_name) != nullptr);
    const std::string socket_path = std::string(dir_name) + "/sock";
    EventLoop loop;
    std::vector<Fd> listeners;
    listeners.push_back(listen_unix(socket_path));
    HttpServer::Options options;
    options.admit = [&](HttpExchange&) {
        HttpServer::Admission admission;
        admission.errors = &e2b_http_errors();
        admission.streams_body = true;
        admission.handler = [&](const std::shared_ptr<HttpExchange>& exchange) {
            std::shared_ptr<MultipartBody> parser = MultipartBody::open(
                *exchange, MultipartBody::Handlers{[&](const MultipartBody::Part& part) {
                                                       seen.parts.push_back(part);
                                                       seen.data.emplace_back();
                                                   },
                                                   [&](std::string_view bytes) { seen.data.back().append(bytes); }});
            seen.opened = parser != nullptr;
            if (!parser)
                return exchange->respond(415, "{}");
            exchange->read_body(
                [&seen, parser](std::string_view piece) {
                    if (!parser->feed(piece))
                        seen.malformed = true;
                },
                [&seen, parser, exchange] {
                    seen.whole = parser->finish();
                    exchange->respond(200, "{}");
                });
        };
        return admission;
    };
    HttpServer server(loop, std::move(listeners), options);

    std::string answer;
    test::run_loop_with_client(loop, [&] {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        socket_path.copy(address.sun_path, sizeof address.sun_path - 1);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
            const std::string request = "POST /files HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: "
                                        + content_type + "\r\nContent-Length: " + std::to_string(body.size())
                                        + "\r\n\r\n" + body;
            // Written in small pieces when asked, so that MHD hands the body over cut anywhere.
            const size_t step = write_bytes ? write_bytes : request.size();
            for (size_t at = 0; at < request.size(); at += step) {
                (void)!::write(fd, request.data() + at, std::min(step, request.size() - at));
                if (write_bytes)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            char buffer[4096];
            for (ssize_t got; (got = ::read(fd, buffer, sizeof buffer)) > 0;)
                answer.append(buffer, static_cast<size_t>(got));
        }
        ::close(fd);
    });
    std::filesystem::remove_all(dir_name);
    return answer;
}

const std::string boundary = "----formdata-undici-012345678901";

std::string file_part(const std::string& name, const std::string& filename, const std::string& bytes)
{
    return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\"; filename=\"" + filename
           + "\"\r\nContent-Type: application/octet-stream\r\n\r\n" + bytes + "\r\n";
}

} // namespace

TEST_CASE("a multipart body's parts, as undici's FormData sends them, whole and cut anywhere")
{
    // Bytes that look like a boundary's start, and a NUL, are a file's like any others.
    using namespace std::string_literals;  // "..."s keeps the NUL and what follows it
    const std::string tricky = "line\r\n--not the boundary\r\n\0end"s;
    const std::string body = file_part("file", "/home/user/a.txt", "hello") + file_part("file", "/tmp/empty", "")
                             + "--" + boundary + "\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n"
                             + file_part("file", "b.bin", tricky) + "--" + boundary + "--\r\n";
    for (const size_t step : {size_t{0}, size_t{7}}) {
        CAPTURE(step);
        Seen seen;
        const std::string answer = serve_one("multipart/form-data; boundary=" + boundary, body, seen, step);
        CHECK(answer.starts_with("HTTP/1.1 200"));
        CHECK(seen.opened);
        CHECK(!seen.malformed);
        CHECK(seen.whole);
        REQUIRE(seen.parts.size() == 4);
        CHECK(seen.parts[0].name == "file");
        CHECK(seen.parts[0].filename == "/home/user/a.txt");
        CHECK(seen.parts[0].content_type == "application/octet-stream");
        CHECK(seen.data[0] == "hello");
        CHECK(seen.parts[1].filename == "/tmp/empty");
        CHECK(seen.data[1].empty());
        CHECK(seen.parts[2].name == "note");
        CHECK(!seen.parts[2].filename);
        CHECK(seen.data[2] == "hi");
        CHECK(seen.parts[3].filename == "b.bin");
        CHECK(seen.data[3] == tricky);
    }
}

TEST_CASE("a multipart body cut short or garbled is malformed; other bodies are not multipart")
{
    SUBCASE("no closing boundary")
    {
        Seen seen;
        serve_one("multipart/form-data; boundary=" + boundary, file_part("file", "/a", "partial"), seen);
        CHECK(seen.opened);
        CHECK(!seen.whole);
    }
    SUBCASE("a part without the blank line after its headers")
    {
        Seen seen;
        serve_one("multipart/form-data; boundary=" + boundary,
                  "--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a\"\r\n--" + boundary
                      + "--\r\n",
                  seen);
        CHECK(seen.opened);
        CHECK((seen.malformed || !seen.whole));
    }
    SUBCASE("bytes after the closing boundary that are not a line end")
    {
        Seen seen;
        serve_one("multipart/form-data; boundary=" + boundary,
                  file_part("file", "/a", "x") + "--" + boundary + "--\r\ntrailing garbage", seen);
        CHECK(seen.opened);
        CHECK((seen.malformed || !seen.whole));
    }
    SUBCASE("no boundary in the Content-Type")
    {
        Seen seen;
        const std::string answer = serve_one("multipart/form-data", file_part("file", "/a", "x"), seen);
        CHECK(!seen.opened);
        CHECK(answer.starts_with("HTTP/1.1 415"));
    }
    SUBCASE("a form, not multipart")
    {
        Seen seen;
        serve_one("application/x-www-form-urlencoded", "file=x", seen);
        CHECK(!seen.opened);
    }
}
