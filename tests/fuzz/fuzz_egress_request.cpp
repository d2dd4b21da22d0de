// Fuzzes what a tool in a sandbox sends the host's egress proxy (service/egress/
// proxy_request.hpp): the input is a split pattern (its first byte: how the bytes are cut into
// pieces, as a socket would hand them over), then the bytes, fed piece by piece and then the
// connection's end. Every refusal must be a ProxyRefusal; a crash, an exception or a sanitizer
// report is a finding. Invariants: one reading at most, and one once the connection ended; a
// destination's port from 1 to 65535 and its host non-empty printable ASCII; the head taken
// within the bound, ending in an empty line, without a bare CR, and the early bytes the tail
// of what was fed; an upstream head in origin-form, CRLF-terminated lines without control
// characters, no proxy or hop field, one Host, ending "Connection: close" CRLF CRLF; a
// refusal's reason printable, and its answer (proxy_answer.hpp) one whose Content-Length is
// its body's.
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <fmt/format.h>

#include "service/egress/proxy_answer.hpp"
#include "service/egress/proxy_request.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;

namespace {

Seeds make_seeds()
{
    Seeds seeds;
    for (const auto& [name, request] : std::initializer_list<std::pair<const char*, std::string_view>>{
             {"connect", "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nProxy-Connection: keep-alive\r\n\r\n"},
             {"connect-early", std::string_view("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x00\x05", 44)},
             {"get", "GET http://example.com:8080/simple/?q=1#f HTTP/1.1\r\nHost: other\r\n"
                     "Connection: keep-alive, X-P\r\nX-P: 1\r\nProxy-Authorization: Basic eA==\r\n\r\n"},
             {"post", "POST http://10.0.0.1/u HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello"},
             {"chunked", "PUT http://[::1]/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
             {"origin", "GET /x HTTP/1.1\r\nHost: example.com\r\n\r\n"},
             {"authority", "GET example.com:443 HTTP/1.1\r\n\r\n"},
             {"folded", "GET http://a.example/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n"},
         }) {
        Builder b;
        b.put<uint8_t>(6);
        b.append(std::span(reinterpret_cast<const uint8_t*>(request.data()), request.size()));
        seeds.emplace_back(name, b.take());
    }
    return seeds;
}

bool printable(std::string_view text)
{
    for (char c : text) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20 || byte >= 0x7f)
            return false;
    }
    return true;
}

bool starts_with_field(std::string_view line, std::string_view name)
{
    if (line.size() <= name.size() || line[name.size()] != ':')
        return false;
    for (size_t i = 0; i < name.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(line[i])) != std::tolower(static_cast<unsigned char>(name[i])))
            return false;
    return true;
}

void check_upstream_head(const ProxyRequest& request)
{
    const std::string_view head = request.upstream_head;
    check(head.starts_with(request.method + " /"), "an upstream head in origin-form");
    check(head.ends_with("\r\nConnection: close\r\n\r\n"), "an upstream head ending Connection: close CRLF CRLF");
    check(head.find("\r\n\r\n") == head.size() - 4, "one end of head, at its end");
    int hosts = 0;
    for (std::string_view rest = head.substr(0, head.size() - 2); !rest.empty();) {
        const size_t end = rest.find("\r\n");
        check(end != std::string_view::npos, "upstream lines end in CRLF");
        const std::string_view line = rest.substr(0, end);
        for (char c : line) {
            const auto byte = static_cast<unsigned char>(c);
            check((byte >= 0x20 && byte != 0x7f) || c == '\t', "no control character upstream");
        }
        if (line.data() != head.data()) {
            check(!line.empty() && line.front() != ' ' && line.front() != '\t', "no folded line upstream");
            check(line.find(':') != std::string_view::npos, "a field line upstream");
            hosts += starts_with_field(line, "Host") ? 1 : 0;
            for (std::string_view hop : {"Proxy-Connection", "Proxy-Authorization", "Keep-Alive", "Upgrade", "TE"})
                check(!starts_with_field(line, hop), "no hop-by-hop field upstream");
        } else {
            check(line.ends_with(" HTTP/1.1") || line.ends_with(" HTTP/1.0"), "HTTP/1.1 or 1.0 upstream");
        }
        rest.remove_prefix(end + 2);
    }
    check(hosts == 1, "one Host upstream");
}

void check_request(const ProxyRequest& request, std::string_view fed)
{
    const ProxyDestination& destination = request.destination;
    check(destination.port >= 1, "a port from 1 to 65535");
    check(!destination.host.empty() && printable(destination.host) && destination.host.find(' ') == std::string::npos,
          "a host, printable");
    check(!destination.address || destination.address->text() == destination.host, "an IP literal's host is its text");
    check(fed.ends_with(request.early), "early bytes the tail of what was fed");
    const std::string_view head = fed.substr(0, fed.size() - request.early.size());
    check(head.size() <= ProxyRequestReader::max_head_bytes, "a head within the bound");
    // Where the reader says the head ends, the guest's bytes must say so too: an empty line.
    check(head.ends_with("\n\r\n") || head.ends_with("\n\n"), "a head ending in an empty line");
    for (size_t i = 0; i + 1 < head.size(); ++i)
        check(head[i] != '\r' || head[i + 1] == '\n', "no bare CR in a head taken");
    if (request.kind == ProxyRequest::Kind::tunnel) {
        check(request.method == "CONNECT" && request.upstream_head.empty(), "a tunnel is a CONNECT, with no head");
        return;
    }
    check(request.method != "CONNECT", "a CONNECT is a tunnel");
    check_upstream_head(request);
}

void check_refusal(const ProxyRefusal& refusal)
{
    check(!refusal.reason.empty() && printable(refusal.reason), "a reason, printable");
    const std::string answer = proxy_refusal_answer(ProxyRefusalStatus::bad_request, refusal.reason);
    const size_t end = answer.find("\r\n\r\n");
    check(end != std::string::npos, "an answer with a head");
    const std::string_view body = std::string_view(answer).substr(end + 4);
    check(answer.find(fmt::format("\r\nContent-Length: {}\r\n", body.size())) < end, "Content-Length its body's");
    check(body.starts_with("agentvm egress: ") && body.find('\n') == body.size() - 1, "a one-line body");
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
    Input input(data, size);
    const size_t piece = 1 + input.byte();
    const std::span<const uint8_t> rest = input.rest();
    const std::string_view bytes(reinterpret_cast<const char*>(rest.data()), rest.size());

    ProxyRequestReader reader;
    std::optional<ProxyReading> reading;
    size_t fed = 0;  // when the reading came
    for (size_t at = 0; at < bytes.size(); at += piece) {
        auto result = reader.feed(bytes.substr(at, piece));
        if (!result)
            continue;
        check(!reading, "one reading at most");
        reading = std::move(result);
        fed = std::min(at + piece, bytes.size());
    }
    auto at_end = reader.feed({});
    check(!(reading && at_end), "one reading at most, the end included");
    if (!reading)
        reading = std::move(at_end);
    check(reading.has_value() && reader.done(), "a reading once the connection ended");

    if (const auto* request = std::get_if<ProxyRequest>(&*reading))
        check_request(*request, bytes.substr(0, fed));
    else
        check_refusal(std::get<ProxyRefusal>(*reading));
    return 0;
}
