#include "cli/port_forward/upgrade_head.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/port_forward/handshake.hpp"
#include "common/ascii_text.hpp"

namespace agentvm {
namespace {

bool same_text(std::string_view a, std::string_view b)
{
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

UpgradeHead malformed(std::string problem)
{
    UpgradeHead head;
    head.parse = UpgradeHead::Parse::malformed;
    head.problem = std::move(problem);
    return head;
}

// RFC 9110's token characters, for a header's name.
bool token_char(char c)
{
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// The status line: HTTP/1.x SP 3DIGIT [SP reason].
bool parse_status_line(std::string_view line, UpgradeHead& head)
{
    if (line.size() < 12 || !line.starts_with("HTTP/1.") || !std::isdigit(static_cast<unsigned char>(line[7])) ||
        line[8] != ' ')
        return false;
    const std::string_view code = line.substr(9, 3);
    if (!std::all_of(code.begin(), code.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        return false;
    if (line.size() > 12 && line[12] != ' ')
        return false;
    std::from_chars(code.data(), code.data() + code.size(), head.status);
    head.reason = std::string(line.size() > 13 ? line.substr(13) : std::string_view());
    return true;
}

} // namespace

std::string upgrade_request_text(const UpgradeRequest& request)
{
    std::string text = fmt::format("GET {}/v1/sandboxes/{}/tcp/{} HTTP/1.1\r\n"
                                   "Host: {}\r\n"
                                   "Connection: Upgrade\r\n"
                                   "Upgrade: {}\r\n",
                                   request.prefix, request.sandbox, request.port, request.host_header,
                                   tcp_upgrade_protocol);
    if (!request.token.empty())
        text += fmt::format("Authorization: Bearer {}\r\n", request.token);
    return text + "\r\n";
}

std::string sandbox_id_problem(std::string_view id)
{
    if (id.empty())
        return "the sandbox id is empty";
    if (id.size() > 256)
        return "the sandbox id is longer than 256 bytes";
    for (const char c : id)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_' && c != '~')
            return fmt::format("'{}' is not a sandbox id: only letters, digits, '-', '.', '_' and '~'", printable(id));
    if (id == "." || id == "..")
        return fmt::format("'{}' is not a sandbox id", id);
    return {};
}

std::optional<std::string> UpgradeHead::header(std::string_view name) const
{
    for (const auto& [key, value] : headers)
        if (same_text(key, name))
            return value;
    return std::nullopt;
}

bool UpgradeHead::upgraded() const
{
    if (parse != Parse::complete || status != 101)
        return false;
    const std::optional<std::string> upgrade = header("Upgrade");
    return upgrade && same_text(trim_blanks(*upgrade), tcp_upgrade_protocol);
}

UpgradeHead parse_upgrade_head(std::string_view received)
{
    // Refuse a stream that is plainly not HTTP as soon as its first bytes show it, rather than
    // after 16 KiB or the timeout.
    constexpr std::string_view version = "HTTP/1.";
    const size_t known = std::min(received.size(), version.size());
    if (received.substr(0, known) != version.substr(0, known))
        return malformed(fmt::format("not an HTTP/1.x answer: '{}'", printable(received.substr(0, 64))));

    UpgradeHead head;
    size_t start = 0;
    bool first = true;
    for (;;) {
        const size_t newline = received.find('\n', start);
        if (newline == std::string_view::npos || newline >= max_upgrade_head) {
            head.parse = received.size() >= max_upgrade_head ? UpgradeHead::Parse::too_large
                                                             : UpgradeHead::Parse::incomplete;
            if (head.parse == UpgradeHead::Parse::too_large)
                head.problem = fmt::format("the answer's head is longer than {} bytes", max_upgrade_head);
            return head;
        }
        std::string_view line = received.substr(start, newline - start);
        if (line.ends_with('\r'))
            line.remove_suffix(1);
        start = newline + 1;
        if (first) {
            if (!parse_status_line(line, head))
                return malformed(fmt::format("not an HTTP/1.x status line: '{}'", printable(line)));
            first = false;
            continue;
        }
        if (line.empty()) {
            head.parse = UpgradeHead::Parse::complete;
            head.length = start;
            return head;
        }
        if (line.front() == ' ' || line.front() == '\t')
            return malformed(fmt::format("a folded header line: '{}'", printable(line)));
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos || colon == 0 ||
            !std::all_of(line.begin(), line.begin() + static_cast<std::ptrdiff_t>(colon), token_char))
            return malformed(fmt::format("not a header line: '{}'", printable(line)));
        head.headers.emplace_back(std::string(line.substr(0, colon)), std::string(trim_blanks(line.substr(colon + 1))));
    }
}

std::string upgrade_refusal(const UpgradeHead& head, std::string_view body)
{
    std::string text = fmt::format("serve answered {} {}", head.status, printable(head.reason));
    if (head.status == 101)
        return text + fmt::format(" without 'Upgrade: {}'", tcp_upgrade_protocol);
    const nlohmann::json json = nlohmann::json::parse(body, nullptr, false);
    if (json.is_object() && json.contains("error")) {
        const nlohmann::json& error = json["error"];
        // The native shape has the code as "error" and the message beside it; the nested one
        // has both inside "error".
        const nlohmann::json& fields = error.is_object() ? error : json;
        const nlohmann::json* code = error.is_object() ? (fields.contains("code") ? &fields["code"] : nullptr) : &error;
        const std::string code_text = code && code->is_string() ? code->get<std::string>() : "";
        const std::string message =
            fields.contains("message") && fields["message"].is_string() ? fields["message"].get<std::string>() : "";
        if (!code_text.empty() || !message.empty())
            return text + fmt::format(": {}{}{}", printable(code_text),
                                      !code_text.empty() && !message.empty() ? ": " : "", printable(message, 1000));
    }
    std::string_view rest = body;
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back())))
        rest.remove_suffix(1);
    if (!rest.empty())
        text += ": " + printable(rest);
    return text;
}

} // namespace agentvm
