#include "cli/port_forward/serve_handshake.hpp"

#include <fmt/format.h>

#include "common/whole_number.hpp"

namespace agentvm {

HandshakeStep ServeUpgradeHandshake::advance(std::string& received, bool eof)
{
    using Kind = HandshakeStep::Kind;
    if (refusal_)
        return refusal_with_body(received, eof);
    UpgradeHead head = parse_upgrade_head(received);
    switch (head.parse) {
    case UpgradeHead::Parse::incomplete:
        if (eof)
            return {Kind::refused, received.empty() ? "serve closed the connection without answering"
                                                    : "serve closed the connection in the middle of its answer"};
        return {};
    case UpgradeHead::Parse::malformed:
    case UpgradeHead::Parse::too_large:
        return {Kind::refused, "serve's answer: " + head.problem};
    case UpgradeHead::Parse::complete:
        break;
    }
    received.erase(0, head.length);
    if (head.upgraded())
        return {Kind::done, {}};
    refusal_ = std::move(head);
    return refusal_with_body(received, eof);
}

// The body is serve's JSON error, sent with a Content-Length (libmicrohttpd's answers from a
// buffer); without one it lasts until serve closes. A chunked body is not decoded: the status
// alone is reported then.
HandshakeStep ServeUpgradeHandshake::refusal_with_body(std::string& received, bool eof)
{
    using Kind = HandshakeStep::Kind;
    const size_t room = max_upgrade_head;
    const std::optional<std::string> encoding = refusal_->header("Transfer-Encoding");
    if (encoding)
        return {Kind::refused, upgrade_refusal(*refusal_, "")};
    std::optional<size_t> length;
    if (const std::optional<std::string> value = refusal_->header("Content-Length"))
        length = whole_number<size_t>(*value);
    if (refusal_->status == 101 || refusal_->status == 204 || refusal_->status == 304)
        length = 0;
    const size_t wanted = std::min(length.value_or(room), room);
    if (received.size() < wanted && !eof)
        return {};
    return {Kind::refused, upgrade_refusal(*refusal_, std::string_view(received).substr(0, wanted))};
}

} // namespace agentvm
