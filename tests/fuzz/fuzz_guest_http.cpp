// Fuzzes what a server inside a guest answers serve's relayed request with (service/ports/
// guest_http_response.hpp): the input is a split pattern (its first byte: how the answer is cut
// into pieces, as a socket would hand it over), whether the request was HEAD, then the answer's
// bytes, fed piece by piece and then the connection's end. Every refusal must be an error the
// reader returns; a crash, an exception or a sanitizer report is a finding. Invariants: a head is
// reported at most once and within the bounds, no field it passes on holds a control character,
// and no body byte comes before the head or after the end.
#include <cstdint>
#include <string>
#include <string_view>

#include "service/ports/guest_http_response.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;

namespace {

Seeds make_seeds()
{
    Seeds seeds;
    for (const auto& [name, answer] : std::initializer_list<std::pair<const char*, const char*>>{
             {"length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"},
             {"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
             {"close", "HTTP/1.1 404 Not Found\r\n\r\nuntil the end"},
             {"interim", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"},
             {"upgrade", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x00"},
         }) {
        Builder b;
        b.put<uint8_t>(7).put<uint8_t>(0);
        const std::string_view text(answer);
        b.append(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
        seeds.emplace_back(name, b.take());
    }
    return seeds;
}

bool has_control_character(std::string_view text)
{
    for (char c : text) {
        const auto byte = static_cast<unsigned char>(c);
        if ((byte < 0x20 && byte != '\t') || byte == 0x7f)
            return true;
    }
    return false;
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
    const bool head_request = input.flag();
    const std::span<const uint8_t> rest = input.rest();
    const std::string_view answer(reinterpret_cast<const char*>(rest.data()), rest.size());

    int heads = 0;
    bool ended = false;
    GuestHttpResponse response(head_request, {[&](const GuestHttpResponse::Head& head) {
                                                  ++heads;
                                                  check(head.status >= 100 && head.status <= 599, "a status from 100 to 599");
                                                  check(head.headers.size() <= GuestHttpResponse::max_fields,
                                                        "at most max_fields fields");
                                                  for (const auto& [name, value] : head.headers)
                                                      check(!has_control_character(name) && !has_control_character(value),
                                                            "no control character passed on");
                                              },
                                              [&](std::string_view) {
                                                  check(heads == 1 && !ended, "body bytes only between head and end");
                                              },
                                              [&] { ended = true; }});
    std::optional<std::string> error;
    for (size_t at = 0; at < answer.size() && !error && !response.ended(); at += piece)
        error = response.feed(answer.substr(at, piece));
    if (!error && !response.ended())
        error = response.feed({});
    check(heads <= 1, "one head at most");
    check(ended == response.ended(), "ended() as reported");
    check(error.has_value() || response.ended(), "an answer either ends or fails");
    return 0;
}
