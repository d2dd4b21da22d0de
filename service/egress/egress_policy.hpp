// Where a sandbox may connect out (issue 29, "Outbound: egress by policy"): allow and deny
// rules by host name, IP range and port, and the decision the host proxy asks of them.
//
// A rule is HOST[:PORTS]:
//   HOST   pypi.org                  that name only (lower-cased, a trailing dot ignored; an
//                                    IDN as its A-label, xn--...)
//          *.pythonhosted.org        its subdomains at any depth, not pythonhosted.org itself
//          10.0.0.0/8, 1.1.1.1       an IPv4 range or address
//          fd00::/8, [fd00::/8]      an IPv6 one; in brackets when a port follows
//          *                         any public destination
//   PORTS  443, 80,443, 8000-8100 or a mix; absent: any port
// At most max_egress_rules rules a list, each at most max_egress_rule_length characters.
//
// The proxy decides in two steps: check_name before it resolves, check_address for each
// address the name resolves to (check_address repeats check_name's verdict, so it alone is
// enough). Deny beats allow. A special address (address_class.hpp: private, loopback,
// link-local, metadata, ...) is reached only through an allow rule whose range lies inside
// that address's special range and contains it, e.g. 10.0.0.0/8 or 10.1.2.3 for 10.1.2.3:
// never through a name rule, `*`, or a range wider than the special one (0.0.0.0/0,
// 169.254.0.0/16 for the metadata address). Whatever a name resolves to is judged that way,
// so a name cannot be made to resolve its way around a rule (DNS rebinding). An IPv6 address
// carrying an IPv4 one (::ffff:10.1.2.3, 64:ff9b::a01:203, 2002:a01:203::) is matched by IPv4
// rules through the address it carries, and special through it.
//
// Pure: no DNS, no sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "service/egress/address_class.hpp"

namespace agentvm {

constexpr size_t max_egress_rules = 256;
constexpr size_t max_egress_rule_length = 253;

struct PortRange {
    uint16_t first = 1;
    uint16_t last = 65535;
};

struct EgressRule {
    enum class Kind {
        any,       // *
        name,      // pypi.org
        wildcard,  // *.pythonhosted.org: `name` holds pythonhosted.org
        range,     // an IP address or CIDR range: `range`
    };
    Kind kind = Kind::any;
    std::string name;
    IpPrefix range;
    std::vector<PortRange> ports;  // empty: any port

    bool matches_port(uint16_t port) const;
    // A host name, lower-case without a trailing dot; never an IP address.
    bool matches_name(std::string_view host) const;
    // The rule's range holds `address`, or the IPv4 address it carries.
    bool matches_address(const IpAddress& address) const;
    // The canonical text: "*.pythonhosted.org:443", "[fd00::/8]:80,443", "10.0.0.0/8".
    std::string text() const;
};

// What is wrong with `name` as a DNS host name (lower-case, without its trailing dot; an IDN
// as its A-label), or "": the one check of names for rules and for what the proxy is asked.
std::string host_name_problem(std::string_view name);

// Throws Error("egress rule '<text>': <what is wrong>").
EgressRule parse_egress_rule(std::string_view text);
// Throws Error naming the list (e.g. "allow") and the first bad rule.
std::vector<EgressRule> parse_egress_rules(const std::vector<std::string>& texts, std::string_view list = "egress");

struct EgressDecision {
    bool allowed = false;
    // Refused: why, for the proxy's error and the sandbox's user. Allowed: which rule let it
    // through, for logs and the call history.
    std::string reason;

    explicit operator bool() const { return allowed; }
};

struct EgressPolicy {
    std::vector<EgressRule> allow;  // empty: nothing is allowed (the default)
    std::vector<EgressRule> deny;

    // Throws Error naming the list and the rule.
    static EgressPolicy parse(const std::vector<std::string>& allow, const std::vector<std::string>& deny);

    // Whether any destination could be allowed: some allow rule, and no port-less `*` denial.
    bool allows_any() const;

    // Before resolving `host` (a name, or an IP literal, [IPv6] brackets allowed): refused when
    // a deny rule matches the name and port, or when no allow rule could match it. An IP
    // literal is decided as check_address decides its address.
    EgressDecision check_name(std::string_view host, uint16_t port) const;
    // For each address `host` resolves to, each decided alone.
    EgressDecision check_address(std::string_view host, uint16_t port, const IpAddress& address) const;

    // "allow pypi.org:443, *.pythonhosted.org:443; deny 10.9.0.0/16", or "allow nothing".
    std::string describe() const;
};

} // namespace agentvm
