// The client's half of serve's TCP upgrade (GET /v1/sandboxes/{id}/tcp/{port} with
// `Upgrade: agentvm-tcp`, answered `101 Switching Protocols`): the request, and a parser of
// the one answer head it reads. Hand-written rather than an HTTP library because this is all
// of HTTP the static agentvm speaks: one request, one status line, headers up to the blank
// line; after a 101 the connection is raw bytes no library would hand back intact.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace agentvm {

inline constexpr size_t max_upgrade_head = 16 * 1024;
inline constexpr std::string_view tcp_upgrade_protocol = "agentvm-tcp";

struct UpgradeRequest {
    std::string host_header;
    std::string prefix;  // in front of /v1/..., without a trailing '/'
    std::string sandbox;
    uint16_t port = 0;
    std::string token;  // "" sends no Authorization
};

// The request's bytes. The sandbox id and the token are checked by the command (one URL path
// segment; one word), so nothing here can split a header.
std::string upgrade_request_text(const UpgradeRequest& request);

// A sandbox id as one path segment: letters, digits, '-', '.', '_' and '~' (a URL's
// unreserved characters; serve's ids are <node>-<hex>-<hex>). Returns "" or the problem.
std::string sandbox_id_problem(std::string_view id);

struct UpgradeHead {
    enum class Parse {
        incomplete,  // no blank line yet, and under max_upgrade_head
        complete,
        malformed,   // not an HTTP/1.x answer head; `problem` says how
        too_large,   // no blank line within max_upgrade_head bytes
    };
    Parse parse = Parse::incomplete;
    int status = 0;
    std::string reason;
    std::vector<std::pair<std::string, std::string>> headers;  // names as sent, values trimmed
    size_t length = 0;  // complete: the head's bytes, blank line included; what follows is the body
    std::string problem;

    // The first header of that name, compared without case.
    std::optional<std::string> header(std::string_view name) const;
    // A 101 whose Upgrade names agentvm-tcp.
    bool upgraded() const;
};

// Parses the head at the start of `received` (lines end in CRLF, or a bare LF).
UpgradeHead parse_upgrade_head(std::string_view received);

// Why an answer other than the upgrade refused it, for the log: the status and serve's error
// from the body (docs/api.md: {"error": CODE, "message": TEXT}, or the nested
// {"error": {"code": CODE, "message": TEXT}}), else the body itself, clipped and escaped.
std::string upgrade_refusal(const UpgradeHead& head, std::string_view body);

} // namespace agentvm
