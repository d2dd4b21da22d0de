// The head of the HTTP/1.1 request serve sends to a server inside the guest for a client's
// request to one of its ports: the client's method, target and headers, less what belongs to
// the hop from the client to serve (RFC 9110 7.6.1's connection-specific fields) and the
// credentials serve itself took (`strip`); the body's framing is said anew, since MHD has
// already taken the client's apart. One guest connection per request: "Connection: close",
// or the client's "Upgrade" passed on when it asks for one (a WebSocket).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace agentvm {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

enum class BodyFraming { none, length, chunked };

struct GuestRequestHead {
    std::string text;
    BodyFraming framing = BodyFraming::none;
    bool upgrade = false;  // the client asked to switch protocols
};

// `target` must start with '/'. Header names in `strip` are compared without case.
GuestRequestHead guest_request_head(const std::string& method, const std::string& target, const HeaderList& headers,
                                    const std::vector<std::string>& strip);

// Whether a header is one of the hop's own (never passed on in either direction).
bool hop_by_hop_header(const std::string& name);

} // namespace agentvm
