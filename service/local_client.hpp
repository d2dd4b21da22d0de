// What a request served without a token must show to be from this host's own clients: serve
// then listens on loopback or a Unix socket only, but a browser on this host reaches a
// loopback port too, for any web page it shows: by a cross-site request (a form's POST to
// /run_code, carrying the page's Origin) or by DNS rebinding (the attacker's name made to
// resolve to 127.0.0.1, carried in Host). client_auth.cpp refuses both with these checks.
#pragma once

#include <string_view>

namespace agentvm {

// A Host header naming this host: localhost, a 127.0.0.0/8 address or [::1] (any spelling
// inet_pton takes), each with an optional port.
bool is_loopback_host(std::string_view host);
// An Origin header of a page served from this host: http:// or https:// and a loopback host
// as above. "null" (a sandboxed frame, a file) and every other origin are not.
bool is_loopback_origin(std::string_view origin);

} // namespace agentvm
