#include "service/egress/egress_policy.hpp"

#include <algorithm>
#include <array>
#include <optional>

#include <fmt/format.h>

#include "common/ascii_text.hpp"
#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {

namespace {

bool all_digits(std::string_view text)
{
    return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool hex_number(std::string_view text)
{
    return text.starts_with("0x") &&
           std::all_of(text.begin() + 2, text.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// `text` fit to quote in a message that may end in a proxy error, a log or JSON: valid UTF-8
// kept, control characters and invalid bytes as \xNN, at most `max` bytes of it. Rules and
// hosts come from API clients and guests.
std::string shown(std::string_view text, size_t max = 100)
{
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
    const auto continuation = [&](size_t i, unsigned char low = 0x80, unsigned char high = 0xbf) {
        return i < text.size() && byte(i) >= low && byte(i) <= high;
    };
    std::string out;
    size_t i = 0;
    while (i < text.size() && i < max) {
        const unsigned char c = byte(i);
        size_t length = 0;  // of a valid sequence starting at i; 0: escape the byte
        if (c >= 0x20 && c < 0x7f)
            length = 1;
        else if (c >= 0xc2 && c <= 0xdf)
            length = continuation(i + 1) ? 2 : 0;
        else if (c >= 0xe0 && c <= 0xef)
            length = continuation(i + 1, c == 0xe0 ? 0xa0 : 0x80, c == 0xed ? 0x9f : 0xbf) && continuation(i + 2) ? 3 : 0;
        else if (c >= 0xf0 && c <= 0xf4)
            length = continuation(i + 1, c == 0xf0 ? 0x90 : 0x80, c == 0xf4 ? 0x8f : 0xbf) && continuation(i + 2) &&
                             continuation(i + 3)
                         ? 4
                         : 0;
        if (length == 0) {
            out += fmt::format("\\x{:02x}", c);
            ++i;
        } else {
            out.append(text.substr(i, length));
            i += length;
        }
    }
    if (i < text.size())
        out += "...";
    return out;
}

} // namespace

std::string host_name_problem(std::string_view name)
{
    if (name.empty())
        return "the name is empty";
    if (std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }))
        return "a non-ASCII name: give an internationalised name as its A-label (punycode, xn--...)";
    if (name.size() > max_egress_rule_length)
        return fmt::format("the name is longer than {} characters", max_egress_rule_length);
    std::string_view last;
    for (std::string_view rest = name;;) {
        const size_t dot = rest.find('.');
        const std::string_view label = rest.substr(0, dot);
        if (label.empty())
            return "the name has an empty label (a leading dot or two dots in a row)";
        if (label.size() > 63)
            return fmt::format("label '{}' is longer than 63 characters", shown(label));
        for (char c : label)
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
                return fmt::format("'{}' is not allowed in a host name", shown(std::string_view(&c, 1)));
        if (label.front() == '-' || label.back() == '-')
            return fmt::format("label '{}' begins or ends with '-'", label);
        last = label;
        if (dot == std::string_view::npos)
            break;
        rest.remove_prefix(dot + 1);
    }
    // 127.1, 2130706433 or 0x7f000001 would be an IPv4 address to getaddrinfo, never a name.
    if (all_digits(last) || hex_number(last))
        return "neither an IP address (give a dotted quad) nor a DNS name (its last label is a number)";
    return "";
}

namespace {

// A host as the proxy names it: an IP literal (IPv6 in brackets or not), or a DNS name.
struct Host {
    std::optional<IpAddress> address;
    std::string name;     // lower-case without its trailing dot; the address's text for a literal
    std::string problem;  // set when it is neither

    std::string where(uint16_t port) const
    {
        if (address && !address->is_v4())
            return fmt::format("[{}]:{}", name, port);
        return fmt::format("{}:{}", name, port);
    }
};

Host parse_host(std::string_view text)
{
    Host host;
    std::string_view inner = text;
    const bool bracketed = text.size() >= 2 && text.front() == '[' && text.back() == ']';
    if (bracketed)
        inner = text.substr(1, text.size() - 2);
    if (const auto address = IpAddress::parse(inner); address && (!bracketed || !address->is_v4())) {
        host.address = address;
        host.name = address->text();
        return host;
    }
    if (bracketed) {
        host.name = std::string(text);
        host.problem = "brackets hold an IPv6 address only";
        return host;
    }
    host.name = ascii_lower(text);
    if (host.name.ends_with('.'))
        host.name.pop_back();
    host.problem = host_name_problem(host.name);
    if (!host.problem.empty())
        host.name = std::string(text);
    return host;
}

struct RuleError {
    std::string_view list;
    std::string_view text;

    [[noreturn]] void operator()(std::string_view what) const
    {
        throw Error(fmt::format("{} rule '{}': {}", list, shown(text, max_egress_rule_length), what));
    }
};

uint16_t parse_port(std::string_view text, const RuleError& fail)
{
    if (text.empty())
        fail("an empty port (ports are 443, 80,443 or 8000-8100)");
    const std::optional<uint16_t> port = port_number(text, true);
    if (!port)
        fail(fmt::format("'{}' is not a port (1-65535)", shown(text)));
    if (*port == 0)
        fail("port 0 is not a destination port");
    return *port;
}

std::vector<PortRange> parse_ports(std::string_view text, const RuleError& fail)
{
    if (text.empty())
        fail("nothing after ':' (give ports, e.g. :443, :80,443 or :8000-8100)");
    std::vector<PortRange> ports;
    for (std::string_view rest = text;;) {
        const size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        const size_t dash = item.find('-');
        if (dash == std::string_view::npos) {
            const uint16_t port = parse_port(item, fail);
            ports.push_back({port, port});
        } else {
            const uint16_t first = parse_port(item.substr(0, dash), fail);
            const uint16_t last = parse_port(item.substr(dash + 1), fail);
            if (first > last)
                fail(fmt::format("port range {} is reversed", item));
            ports.push_back({first, last});
        }
        if (comma == std::string_view::npos)
            break;
        rest.remove_prefix(comma + 1);
    }
    return ports;
}

// ::ffff:a.b.c.d/n (n >= 96) is the IPv4 range a.b.c.d/(n - 96): rules hold it so.
IpPrefix unmapped(const IpPrefix& range)
{
    static const IpPrefix v4_mapped{IpAddress::parse("::ffff:0:0").value_or(IpAddress{}), 96};
    if (!v4_mapped.contains(range))
        return range;
    const auto b = range.network.bytes();
    return IpPrefix{IpAddress::v4(b[12], b[13], b[14], b[15]), range.length - 96};
}

IpPrefix parse_range(std::string_view text, const RuleError& fail)
{
    const size_t slash = text.find('/');
    const std::string_view address_text = text.substr(0, slash);
    const auto address = IpAddress::parse(address_text);
    if (!address) {
        if (address_text.find('%') != std::string_view::npos)
            fail(fmt::format("'{}' is not an IP address (a zone index such as %eth0 is not taken)", shown(address_text)));
        if (slash != std::string_view::npos)
            fail(fmt::format("'{}' is not an IP address (a /prefix length needs one)", shown(address_text)));
        fail(fmt::format("'{}' is neither HOST:PORTS nor an IPv6 address (an IPv6 address takes ports in brackets: "
                         "[fd00::1]:443)",
                         shown(address_text)));
    }
    IpPrefix range{*address, static_cast<unsigned>(address->bits())};
    if (slash != std::string_view::npos) {
        const std::string_view length_text = text.substr(slash + 1);
        const std::optional<unsigned> parsed = whole_number<unsigned>(length_text);
        if (!parsed)
            fail(fmt::format("'{}' is not a prefix length", shown(length_text)));
        const unsigned length = *parsed;
        if (length > address->bits())
            fail(fmt::format("prefix length /{} is out of range for {} (0-{})", length, address->is_v4() ? "IPv4" : "IPv6",
                             address->bits()));
        range.length = length;
        // Bits past the prefix are a typo more often than not: say what the range would be.
        std::array<uint8_t, 16> network{};
        const auto bytes = address->bytes();
        std::copy(bytes.begin(), bytes.end(), network.begin());
        for (size_t bit = length; bit < address->bits(); ++bit)
            network[bit / 8] = static_cast<uint8_t>(network[bit / 8] & ~(0x80u >> (bit % 8)));
        const IpAddress masked = IpAddress::from_bytes({network.data(), bytes.size()}).value_or(*address);
        if (masked != *address)
            fail(fmt::format("{} has bits set past /{} (did you mean {}/{}?)", address_text, length, masked.text(),
                             length));
    }
    return unmapped(range);
}

EgressRule parse_rule(std::string_view text, std::string_view list)
{
    const RuleError fail{list, text};
    if (text.empty())
        fail("empty");
    if (text.size() > max_egress_rule_length)
        throw Error(fmt::format("{} rule '{}': longer than {} characters", list, shown(text, 40),
                                max_egress_rule_length));
    if (text.find_first_of(" \t\r\n") != std::string_view::npos)
        fail("contains white space");
    if (text.find("://") != std::string_view::npos)
        fail("a rule is HOST[:PORTS], not a URL");

    std::string_view host = text;
    std::optional<std::string_view> ports;
    bool bracketed = false;
    if (text.front() == '[') {
        const size_t close = text.find(']');
        if (close == std::string_view::npos)
            fail("a '[' without its ']'");
        host = text.substr(1, close - 1);
        bracketed = true;
        const std::string_view after = text.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':')
                fail("expected ':' and ports after ']'");
            ports = after.substr(1);
        }
    } else if (const size_t colon = text.find(':'); colon != std::string_view::npos) {
        // Two colons or more: an IPv6 address or range, which takes ports only in brackets.
        if (text.find(':', colon + 1) == std::string_view::npos) {
            host = text.substr(0, colon);
            ports = text.substr(colon + 1);
        }
    }

    EgressRule rule;
    if (ports)
        rule.ports = parse_ports(*ports, fail);
    if (host.empty())
        fail("no host before the ports");
    const bool address_like = host.find(':') != std::string_view::npos || host.find('/') != std::string_view::npos ||
                              IpAddress::parse(host).has_value();
    if (bracketed) {
        if (host.find(':') == std::string_view::npos)
            fail("brackets are for IPv6 addresses only");
        rule.kind = EgressRule::Kind::range;
        rule.range = parse_range(host, fail);
    } else if (host == "*") {
        rule.kind = EgressRule::Kind::any;
    } else if (address_like) {
        rule.kind = EgressRule::Kind::range;
        rule.range = parse_range(host, fail);
    } else {
        std::string_view name = host;
        rule.kind = EgressRule::Kind::name;
        if (name.starts_with("*.")) {
            rule.kind = EgressRule::Kind::wildcard;
            name.remove_prefix(2);
        }
        if (name.find('*') != std::string_view::npos)
            fail("a wildcard is '*.' before a domain, as in *.pythonhosted.org, or '*' alone");
        rule.name = ascii_lower(name);
        if (rule.name.ends_with('.'))
            rule.name.pop_back();
        if (const std::string problem = host_name_problem(rule.name); !problem.empty())
            fail(problem);
    }
    return rule;
}

std::string ports_text(const std::vector<PortRange>& ports)
{
    std::string out;
    for (const PortRange& range : ports) {
        if (!out.empty())
            out += ',';
        out += range.first == range.last ? std::to_string(range.first) : fmt::format("{}-{}", range.first, range.last);
    }
    return out;
}

std::string host_text(const EgressRule& rule, bool bracket_v6)
{
    switch (rule.kind) {
    case EgressRule::Kind::any: return "*";
    case EgressRule::Kind::name: return rule.name;
    case EgressRule::Kind::wildcard: return "*." + rule.name;
    case EgressRule::Kind::range:
        if (bracket_v6 && !rule.range.network.is_v4())
            return "[" + rule.range.text() + "]";
        return rule.range.text();
    }
    return "";
}

// "a private address", "the broadcast address", ...
std::string class_phrase(AddressClass kind)
{
    if (kind == AddressClass::broadcast)
        return "the broadcast address";
    const std::string name = address_class_name(kind);
    const bool vowel = name.find_first_of("aeiou") == 0;
    return fmt::format("{} {} address", vowel ? "an" : "a", name);
}

// "::ffff:10.1.2.3 (IPv4 10.1.2.3)" when the class comes from the IPv4 address it carries.
std::string address_phrase(const IpAddress& address, const AddressClassification& classification)
{
    if (classification.embedded_v4)
        return fmt::format("{} (IPv4 {})", address.text(), classification.embedded_v4->text());
    return address.text();
}

// "port 22 is not allowed by any rule (example.com allows 443; * allows 80,443)".
std::string port_refusal(uint16_t port, const std::vector<const EgressRule*>& other_ports)
{
    std::string allowed;
    for (const EgressRule* rule : other_ports) {
        if (!allowed.empty())
            allowed += "; ";
        allowed += fmt::format("{} allows {}", host_text(*rule, false), ports_text(rule->ports));
    }
    return fmt::format("port {} is not allowed by any rule ({})", port, allowed);
}

std::string rules_text(const std::vector<EgressRule>& rules)
{
    std::string out;
    for (const EgressRule& rule : rules) {
        if (!out.empty())
            out += ", ";
        out += rule.text();
    }
    return out;
}

// The allow rules, a few of them, for a refusal that names none.
std::string some_rules(const std::vector<EgressRule>& rules)
{
    constexpr size_t most = 4;
    std::string out;
    for (size_t i = 0; i < rules.size() && i < most; ++i)
        out += (i ? ", " : "") + rules[i].text();
    if (rules.size() > most)
        out += fmt::format(", ... ({} rules)", rules.size());
    return out;
}

EgressDecision allowed(std::string reason)
{
    return {true, std::move(reason)};
}

EgressDecision refused(std::string reason)
{
    return {false, std::move(reason)};
}

// What the rules say of a host name and port, before its addresses are known.
struct NameMatch {
    const EgressRule* denied = nullptr;
    const EgressRule* allowed = nullptr;              // a name, wildcard or * rule for name and port
    std::vector<const EgressRule*> other_ports;       // name rules for the name, not the port
    const EgressRule* range_for_port = nullptr;       // an address rule the name may resolve into
};

NameMatch match_name(const EgressPolicy& policy, const std::string& name, uint16_t port)
{
    NameMatch match;
    for (const EgressRule& rule : policy.deny)
        if (rule.kind != EgressRule::Kind::range && rule.matches_name(name) && rule.matches_port(port) && !match.denied)
            match.denied = &rule;
    for (const EgressRule& rule : policy.allow) {
        if (rule.kind == EgressRule::Kind::range) {
            if (rule.matches_port(port) && !match.range_for_port)
                match.range_for_port = &rule;
        } else if (rule.matches_name(name)) {
            if (!rule.matches_port(port))
                match.other_ports.push_back(&rule);
            else if (!match.allowed)
                match.allowed = &rule;
        }
    }
    return match;
}

// The name step's refusal, if it refuses.
std::optional<EgressDecision> name_refusal(const EgressPolicy& policy, const Host& host, uint16_t port,
                                           const NameMatch& match)
{
    const std::string where = host.where(port);
    if (match.denied)
        return refused(fmt::format("{} is refused by deny rule '{}'", where, match.denied->text()));
    if (match.allowed || match.range_for_port)
        return std::nullopt;
    if (policy.allow.empty())
        return refused(fmt::format("{}: the egress policy allows no destination", where));
    if (!match.other_ports.empty())
        return refused(fmt::format("{}: {}", where, port_refusal(port, match.other_ports)));
    return refused(fmt::format("{}: no rule allows {} (allowed: {})", where, host.name, some_rules(policy.allow)));
}

// The address step. `name_rule` is the rule that allowed the host's name for the port, if
// any; `other_ports` the name rules that match its name at other ports. Literal: the host
// was this address.
EgressDecision decide_address(const EgressPolicy& policy, const std::string& where, uint16_t port,
                              const IpAddress& address, bool literal, const EgressRule* name_rule,
                              std::vector<const EgressRule*> other_ports)
{
    const AddressClassification classification = classify_address(address);
    const std::string address_text = address_phrase(address, classification);
    // "pypi.org:443 resolves to 10.1.2.3", or the literal alone; then "..., a private address".
    const std::string at = literal ? where : fmt::format("{} resolves to {}", where, address_text);
    std::string is = fmt::format("{} resolves to {},", where, address_text);
    if (literal)
        is = classification.embedded_v4 ? fmt::format("{} carries IPv4 {},", where, classification.embedded_v4->text())
                                        : fmt::format("{} is", where);

    for (const EgressRule& rule : policy.deny) {
        const bool covers = rule.kind == EgressRule::Kind::any ||
                            (rule.kind == EgressRule::Kind::range && rule.matches_address(address));
        if (covers && rule.matches_port(port))
            return refused(literal ? fmt::format("{} is refused by deny rule '{}'", where, rule.text())
                                   : fmt::format("{}, which deny rule '{}' refuses", at, rule.text()));
    }

    if (classification.special()) {
        // Only a range inside the special range names it: not *, not a name, not 0.0.0.0/0.
        const IpAddress& subject = classification.subject(address);
        std::vector<const EgressRule*> naming_other_ports;
        const EgressRule* wider = nullptr;
        for (const EgressRule& rule : policy.allow) {
            if (rule.kind != EgressRule::Kind::range || !rule.range.contains(subject))
                continue;
            if (!classification.block.contains(rule.range)) {
                if (!wider)
                    wider = &rule;
            } else if (rule.matches_port(port)) {
                return allowed(
                    fmt::format("{} {}, allowed by rule '{}'", is, class_phrase(classification.kind), rule.text()));
            } else {
                naming_other_ports.push_back(&rule);
            }
        }
        if (!naming_other_ports.empty())
            return refused(fmt::format("{}: {}", where, port_refusal(port, naming_other_ports)));
        std::string hint;
        if (wider)
            hint = fmt::format(" ('{}' is wider than {} and does not name it)", host_text(*wider, false),
                               classification.block.text());
        return refused(fmt::format("{} {}, which no rule names{}", is, class_phrase(classification.kind), hint));
    }

    if (name_rule)
        return allowed(fmt::format("{}: allowed by rule '{}'", at, name_rule->text()));
    for (const EgressRule& rule : policy.allow) {
        const bool covers = (rule.kind == EgressRule::Kind::range && rule.matches_address(address)) ||
                            (literal && rule.kind == EgressRule::Kind::any);
        if (!covers)
            continue;
        if (rule.matches_port(port))
            return allowed(fmt::format("{}: allowed by rule '{}'", at, rule.text()));
        other_ports.push_back(&rule);
    }
    if (!other_ports.empty())
        return refused(fmt::format("{}: {}", where, port_refusal(port, other_ports)));
    if (policy.allow.empty())
        return refused(fmt::format("{}: the egress policy allows no destination", where));
    if (literal)
        return refused(fmt::format("{}: no rule allows {} (allowed: {})", where, address_text, some_rules(policy.allow)));
    return refused(fmt::format("{}, which no rule allows", at));
}

std::optional<EgressDecision> host_refusal(const Host& host, std::string_view text, uint16_t port)
{
    if (!host.problem.empty())
        return refused(fmt::format("'{}' is not a host to connect to: {}", shown(text), host.problem));
    if (port == 0)
        return refused(fmt::format("{}: port 0 is not a destination port", host.where(port)));
    return std::nullopt;
}

} // namespace

bool EgressRule::matches_port(uint16_t port) const
{
    if (ports.empty())
        return true;
    return std::any_of(ports.begin(), ports.end(), [port](const PortRange& allowed_ports) {
        return port >= allowed_ports.first && port <= allowed_ports.last;
    });
}

bool EgressRule::matches_name(std::string_view host) const
{
    switch (kind) {
    case Kind::any: return true;
    case Kind::name: return host == name;
    case Kind::wildcard:
        return host.size() > name.size() + 1 && host.ends_with(name) && host[host.size() - name.size() - 1] == '.';
    case Kind::range: return false;
    }
    return false;
}

bool EgressRule::matches_address(const IpAddress& address) const
{
    if (kind != Kind::range)
        return false;
    if (range.contains(address))
        return true;
    const auto v4 = address.embedded_v4();
    return v4 && range.contains(*v4);
}

std::string EgressRule::text() const
{
    if (ports.empty())
        return host_text(*this, false);
    return host_text(*this, true) + ":" + ports_text(ports);
}

EgressRule parse_egress_rule(std::string_view text)
{
    return parse_rule(text, "egress");
}

std::vector<EgressRule> parse_egress_rules(const std::vector<std::string>& texts, std::string_view list)
{
    if (texts.size() > max_egress_rules)
        throw Error(fmt::format("{} rules: at most {} a list, got {}", list, max_egress_rules, texts.size()));
    std::vector<EgressRule> rules;
    rules.reserve(texts.size());
    for (const std::string& text : texts)
        rules.push_back(parse_rule(text, list));
    return rules;
}

EgressPolicy EgressPolicy::parse(const std::vector<std::string>& allow, const std::vector<std::string>& deny)
{
    return EgressPolicy{parse_egress_rules(allow, "allow"), parse_egress_rules(deny, "deny")};
}

bool EgressPolicy::allows_any() const
{
    return !allow.empty() && std::none_of(deny.begin(), deny.end(), [](const EgressRule& rule) {
        return rule.kind == EgressRule::Kind::any && rule.ports.empty();
    });
}

EgressDecision EgressPolicy::check_name(std::string_view text, uint16_t port) const
{
    const Host host = parse_host(text);
    if (auto refusal = host_refusal(host, text, port))
        return *refusal;
    if (host.address)
        return decide_address(*this, host.where(port), port, *host.address, true, nullptr, {});
    const NameMatch match = match_name(*this, host.name, port);
    if (auto refusal = name_refusal(*this, host, port, match))
        return *refusal;
    if (match.allowed)
        return allowed(fmt::format("{}: allowed by rule '{}'", host.where(port), match.allowed->text()));
    return allowed(fmt::format("{}: its addresses decide (rule '{}' and other address rules)", host.where(port),
                               match.range_for_port->text()));
}

EgressDecision EgressPolicy::check_address(std::string_view text, uint16_t port, const IpAddress& address) const
{
    const Host host = parse_host(text);
    if (auto refusal = host_refusal(host, text, port))
        return *refusal;
    const std::string where = host.where(port);
    if (host.address) {
        // The proxy connects where the literal says; should it hand another address, both must pass.
        EgressDecision decision = decide_address(*this, where, port, *host.address, true, nullptr, {});
        if (decision && !(address == *host.address))
            decision = decide_address(*this, where, port, address, false, nullptr, {});
        return decision;
    }
    const NameMatch match = match_name(*this, host.name, port);
    if (auto refusal = name_refusal(*this, host, port, match))
        return *refusal;
    return decide_address(*this, where, port, address, false, match.allowed, match.other_ports);
}

std::string EgressPolicy::describe() const
{
    std::string out = allow.empty() ? "allow nothing" : "allow " + rules_text(allow);
    if (!deny.empty())
        out += "; deny " + rules_text(deny);
    return out;
}

} // namespace agentvm
