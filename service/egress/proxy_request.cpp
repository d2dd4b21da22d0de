#include "service/egress/proxy_request.hpp"

#include <strings.h>

#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

#include "common/ascii_text.hpp"
#include "service/egress/egress_policy.hpp"

namespace agentvm {

namespace {

ProxyRequestReader& self(http_parser* parser)
{
    return *static_cast<ProxyRequestReader*>(parser->data);
}

bool control_character(char c)
{
    const auto byte = static_cast<unsigned char>(c);
    return byte < 0x20 || byte == 0x7f;
}

bool same_name(std::string_view a, std::string_view b)
{
    return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// RFC 9110 5.6.2's tchar. http_parser, built lenient as Debian builds it, lets a space into
// a field name.
bool token(std::string_view text)
{
    static constexpr std::string_view punctuation = "!#$%&'*+-.^_`|~";
    return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
            || punctuation.find(c) != std::string_view::npos;
    });
}

// Guest text quoted in a reason: printable ASCII as it is, any other byte as \xNN, cut short.
std::string shown(std::string_view text, size_t limit = 80)
{
    std::string out;
    for (char c : text) {
        if (out.size() >= limit)
            return out + "...";
        const auto byte = static_cast<unsigned char>(c);
        if (byte >= 0x20 && byte < 0x7f)
            out += c;
        else
            out += fmt::format("\\x{:02x}", byte);
    }
    return out;
}

bool all_digits(std::string_view text)
{
    return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct Authority {
    ProxyDestination destination;
    std::string problem;  // set when the authority is refused
};

// host[:port] (RFC 3986 3.2.2), the host a name, a dotted quad or an [IPv6] address. Without a
// port: `default_port`, or refused when that is 0.
Authority parse_authority(std::string_view text, uint16_t default_port)
{
    Authority out;
    if (text.empty()) {
        out.problem = "no host";
        return out;
    }
    if (text.find('@') != std::string_view::npos) {
        out.problem = "userinfo (user@host) is not taken: credentials are not passed on";
        return out;
    }
    std::string_view host;
    std::string_view after;
    const bool bracketed = text.front() == '[';
    if (bracketed) {
        const size_t close = text.find(']');
        if (close == std::string_view::npos) {
            out.problem = "a '[' without its ']'";
            return out;
        }
        host = text.substr(1, close - 1);
        after = text.substr(close + 1);
    } else {
        const size_t colon = text.find(':');
        host = text.substr(0, colon);
        after = colon == std::string_view::npos ? std::string_view() : text.substr(colon);
        if (after.find(':', 1) != std::string_view::npos) {
            out.problem = "an IPv6 address takes brackets: [address]:port";
            return out;
        }
    }

    ProxyDestination& destination = out.destination;
    if (after.empty()) {
        if (default_port == 0) {
            out.problem = "no port: the target is host:port";
            return out;
        }
        destination.port = default_port;
    } else if (after.front() != ':') {
        out.problem = "something other than :port follows the host";
        return out;
    } else {
        const std::string_view digits = after.substr(1);
        if (!all_digits(digits) || digits.size() > 5) {
            out.problem = fmt::format("the port '{}' is not a number from 1 to 65535", shown(digits, 16));
            return out;
        }
        unsigned long port = 0;
        for (char c : digits)
            port = port * 10 + static_cast<unsigned long>(c - '0');
        if (port == 0 || port > 65535) {
            out.problem = fmt::format("the port {} is not from 1 to 65535", port);
            return out;
        }
        destination.port = static_cast<uint16_t>(port);
    }

    if (bracketed) {
        const auto address = IpAddress::parse(host);
        if (!address || address->is_v4()) {
            out.problem = fmt::format("'[{}]' is not an IPv6 address", shown(host));
            return out;
        }
        destination.host = address->text();
        destination.address = address;
        return out;
    }
    if (const auto address = IpAddress::parse(host)) {
        destination.host = address->text();
        destination.address = address;
        return out;
    }
    std::string name = ascii_lower(host);
    if (name.ends_with('.'))
        name.pop_back();
    if (const std::string problem = host_name_problem(name); !problem.empty()) {
        out.problem = fmt::format("host '{}': {}", shown(host), problem);
        return out;
    }
    destination.host = std::move(name);
    return out;
}

struct AbsoluteTarget {
    Authority authority;
    std::string origin;  // path and query: the origin-form to send upstream
};

// http://host[:port][/path][?query][#fragment] (RFC 9112 3.2.2); the fragment is not sent.
AbsoluteTarget parse_absolute_target(std::string_view url)
{
    AbsoluteTarget out;
    std::string& problem = out.authority.problem;
    if (url.starts_with('/') || url == "*") {
        problem = "not a proxy request: the target is a path (origin-form); a proxy takes an absolute URI "
                  "(http://host/path) or CONNECT host:port";
        return out;
    }
    const size_t scheme_end = url.find("://");
    if (scheme_end == std::string_view::npos) {
        problem = fmt::format("the target '{}' is not an absolute http:// URI", shown(url));
        return out;
    }
    const std::string scheme = ascii_lower(url.substr(0, scheme_end));
    if (scheme == "https") {
        problem = "an https:// URI: TLS goes through a CONNECT tunnel (HTTPS_PROXY), not a plain proxy request";
        return out;
    }
    if (scheme != "http") {
        problem = fmt::format("the scheme '{}': only http:// URIs and CONNECT tunnels are proxied", shown(scheme));
        return out;
    }
    const std::string_view rest = url.substr(scheme_end + 3);
    const size_t authority_end = rest.find_first_of("/?#");
    out.authority = parse_authority(rest.substr(0, authority_end), 80);
    if (!problem.empty())
        return out;
    std::string_view tail = authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
    tail = tail.substr(0, tail.find('#'));
    // http_parser lets a tab into the target.
    if (std::any_of(tail.begin(), tail.end(), [](char c) { return control_character(c) || c == ' '; })) {
        problem = "the URI's path has a control character in it";
        return out;
    }
    out.origin = tail.empty() || tail.front() != '/' ? "/" + std::string(tail) : std::string(tail);
    return out;
}

// The hop's own fields (RFC 9110 7.6.1), never passed upstream. Upgrade too: the upstream
// connection is for one request, "Connection: close". Unlike guest_request_head.hpp's list,
// the body's framing stays (the body is spliced as it comes) and Expect goes on to the server
// that will answer it.
bool hop_field(std::string_view name)
{
    static constexpr std::array<std::string_view, 8> hop = {"Connection",          "Proxy-Connection", "Keep-Alive",
                                                            "Proxy-Authorization", "Proxy-Authenticate", "TE",
                                                            "Upgrade",             "Host"};
    return std::any_of(hop.begin(), hop.end(), [&](std::string_view h) { return same_name(name, h); });
}

bool framing_field(std::string_view name)
{
    return same_name(name, "Content-Length") || same_name(name, "Transfer-Encoding");
}

// The names a Connection (or Proxy-Connection) field lists, lower-case and sorted.
std::vector<std::string> connection_options(const std::vector<std::pair<std::string, std::string>>& fields)
{
    std::vector<std::string> names;
    for (const auto& [name, value] : fields) {
        if (!same_name(name, "Connection") && !same_name(name, "Proxy-Connection"))
            continue;
        for (std::string_view rest = value; !rest.empty();) {
            const size_t comma = rest.find(',');
            names.push_back(ascii_lower(trim_blanks(rest.substr(0, comma))));
            if (comma == std::string_view::npos)
                break;
            rest.remove_prefix(comma + 1);
        }
    }
    std::sort(names.begin(), names.end());
    return names;
}

ProxyReading refused(std::string reason)
{
    return ProxyRefusal{std::move(reason), false};
}

} // namespace

std::string ProxyDestination::where() const
{
    if (address && !address->is_v4())
        return fmt::format("[{}]:{}", host, port);
    return fmt::format("{}:{}", host, port);
}

ProxyRequestReader::ProxyRequestReader()
{
    http_parser_init(&parser_, HTTP_REQUEST);
    parser_.data = this;
    http_parser_settings_init(&settings_);
    settings_.on_url = &ProxyRequestReader::on_url;
    settings_.on_header_field = &ProxyRequestReader::on_field;
    settings_.on_header_value = &ProxyRequestReader::on_value;
    settings_.on_headers_complete = &ProxyRequestReader::on_headers_complete;
    settings_.on_message_complete = &ProxyRequestReader::on_message_complete;
}

std::optional<ProxyReading> ProxyRequestReader::feed(std::string_view bytes)
{
    if (done_)
        return std::nullopt;
    if (bytes.empty())
        return finish(ProxyRefusal{head_.empty() ? "the connection ended before a request"
                                                 : "the connection ended before the request's head was whole",
                                   true});
    // Never more to http_parser than a head may hold: past that, the head is too long.
    const std::string_view piece = bytes.substr(0, max_head_bytes - head_.size());
    const size_t parsed = std::min(http_parser_execute(&parser_, &settings_, piece.data(), piece.size()), piece.size());
    if (error_)
        return finish(refused(*error_));
    if (head_whole_) {
        head_.append(piece.substr(0, parsed));
        return finish(read_head(bytes.substr(parsed)));
    }
    if (HTTP_PARSER_ERRNO(&parser_) != HPE_OK) {
        head_.append(piece.substr(0, parsed + 1));  // up to the byte refused, however the bytes were cut
        return finish(refused(parser_error()));
    }
    head_.append(piece);
    if (head_.size() >= max_head_bytes)
        return finish(refused(fmt::format("the request's head is over {} bytes", max_head_bytes)));
    return std::nullopt;
}

ProxyReading ProxyRequestReader::finish(ProxyReading reading)
{
    done_ = true;
    return reading;
}

std::string ProxyRequestReader::parser_error() const
{
    const auto error = HTTP_PARSER_ERRNO(&parser_);
    std::string_view line(head_);
    while (!line.empty() && (line.front() == '\r' || line.front() == '\n'))
        line.remove_prefix(1);
    const size_t space = line.find(' ');
    if (error == HPE_INVALID_URL && space != std::string_view::npos && parser_.method != HTTP_CONNECT) {
        // http_parser takes a scheme of letters and "://" for any method but CONNECT, so it
        // stops early in host:port; what it read of the target, up to the byte refused,
        // looks like the start of one.
        const std::string_view target = line.substr(space + 1);
        if (!target.empty() && std::all_of(target.begin(), target.end(), [](char c) {
                return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                    || std::string_view(".-_:[]").find(c) != std::string_view::npos;
            }))
            return fmt::format("{} takes an absolute http:// URI: a host:port target (authority-form) is for "
                               "CONNECT only",
                               http_method_str(static_cast<http_method>(parser_.method)));
    }
    return fmt::format("not an HTTP/1.1 proxy request ({})", http_errno_description(error));
}

int ProxyRequestReader::on_url(http_parser* parser, const char* at, size_t length)
{
    self(parser).url_.append(at, length);
    return 0;
}

int ProxyRequestReader::on_field(http_parser* parser, const char* at, size_t length)
{
    ProxyRequestReader& reader = self(parser);
    if (reader.in_value_ && !reader.commit_field())
        return 1;
    reader.field_.append(at, length);
    return 0;
}

bool ProxyRequestReader::commit_field()
{
    if (fields_.size() >= max_fields) {
        error_ = fmt::format("the request has over {} header fields", max_fields);
        return false;
    }
    fields_.emplace_back(std::move(field_), std::string(trim_blanks(value_)));
    field_.clear();
    value_.clear();
    in_value_ = false;
    return true;
}

int ProxyRequestReader::on_value(http_parser* parser, const char* at, size_t length)
{
    ProxyRequestReader& reader = self(parser);
    reader.in_value_ = true;
    reader.value_.append(at, length);
    return 0;
}

int ProxyRequestReader::on_headers_complete(http_parser* parser)
{
    ProxyRequestReader& reader = self(parser);
    if ((reader.in_value_ || !reader.field_.empty()) && !reader.commit_field())
        return -1;
    reader.head_whole_ = true;
    // Neither a body nor another request for http_parser: what follows the head is spliced.
    return 2;
}

int ProxyRequestReader::on_message_complete(http_parser* /*parser*/)
{
    return 0;
}

ProxyReading ProxyRequestReader::read_head(std::string_view rest) const
{
    const auto method = static_cast<http_method>(parser_.method);
    if (parser_.http_major != 1 || parser_.http_minor > 1)
        return refused(fmt::format("HTTP/{}.{}: only HTTP/1.1 and HTTP/1.0 are proxied", parser_.http_major,
                                   parser_.http_minor));
    for (size_t i = 0; i + 1 < head_.size(); ++i) {
        // http_parser joins a folded line to the one before; RFC 9112 5.2 lets a proxy refuse it.
        if (head_[i] == '\n' && (head_[i + 1] == ' ' || head_[i + 1] == '\t'))
            return refused("a header line begins with whitespace (obsolete line folding)");
        // http_parser, lenient as Debian builds it, takes a bare CR at a value's or a line's
        // start as a line's end, swallows the byte after it, and may end the head there: what
        // the guest wrote as fields would reach the server as body bytes (RFC 9112 2.2).
        if (head_[i] == '\r' && head_[i + 1] != '\n')
            return refused("a bare CR in the request's head");
    }
    bool transfer_encoding = false;
    for (const auto& [name, value] : fields_) {
        if (!token(name))
            return refused(fmt::format("the header field name '{}' is not a token", shown(name)));
        if (std::any_of(value.begin(), value.end(), [](char c) { return control_character(c) && c != '\t'; }))
            return refused(fmt::format("the header field {} has a control character in its value", shown(name)));
        transfer_encoding = transfer_encoding || same_name(name, "Transfer-Encoding");
    }

    ProxyRequest request;
    request.method = http_method_str(method);
    request.early.assign(rest);
    if (method == HTTP_CONNECT) {
        request.kind = ProxyRequest::Kind::tunnel;
        if (url_.find('/') != std::string::npos)
            return refused(fmt::format("CONNECT takes host:port, not '{}'", shown(url_)));
        Authority authority = parse_authority(url_, 0);
        if (!authority.problem.empty())
            return refused(fmt::format("CONNECT {}: {}", shown(url_), authority.problem));
        request.destination = std::move(authority.destination);
        return request;
    }

    AbsoluteTarget target = parse_absolute_target(url_);
    if (!target.authority.problem.empty())
        return refused(fmt::format("{} {}: {}", request.method, shown(url_), target.authority.problem));
    // The body is spliced as it comes, so its length must be one the server reads the same way.
    if (transfer_encoding && parser_.http_minor == 0)
        return refused("Transfer-Encoding in an HTTP/1.0 request");
    if (transfer_encoding && (parser_.flags & F_CHUNKED) == 0)
        return refused("a Transfer-Encoding whose last coding is not chunked: the body's length is unknown");
    request.kind = ProxyRequest::Kind::http;
    request.destination = std::move(target.authority.destination);

    const ProxyDestination& destination = request.destination;
    std::string host = destination.address && !destination.address->is_v4() ? "[" + destination.host + "]"
                                                                             : destination.host;
    if (destination.port != 80)
        host += fmt::format(":{}", destination.port);
    std::string& head = request.upstream_head;
    head = fmt::format("{} {} HTTP/1.{}\r\nHost: {}\r\n", request.method, target.origin, parser_.http_minor, host);
    const std::vector<std::string> options = connection_options(fields_);
    for (const auto& [name, value] : fields_) {
        if (hop_field(name))
            continue;
        // Fields the client's Connection names are the hop's too (RFC 9110 7.6.1); the
        // framing stays whatever it says, or the server would read the body differently.
        if (!framing_field(name) && std::binary_search(options.begin(), options.end(), ascii_lower(name)))
            continue;
        head += name;
        head += ": ";
        head += value;
        head += "\r\n";
    }
    head += "Connection: close\r\n\r\n";
    return request;
}

} // namespace agentvm
