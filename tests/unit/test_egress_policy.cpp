// The egress policy (service/egress/): which addresses are special, rules parsed and refused
// with a message naming the rule, and the proxy's two-step decision: the name before it
// resolves, then each address alone, where a special address needs a rule naming it.
#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "service/egress/address_class.hpp"
#include "service/egress/egress_policy.hpp"

using namespace agentvm;

namespace {

IpAddress ip(const char* text)
{
    const auto address = IpAddress::parse(text);
    REQUIRE_MESSAGE(address, std::string(text));
    return *address;
}

AddressClass class_of(const char* text)
{
    return classify_address(ip(text)).kind;
}

std::string parse_error(const std::string& rule)
{
    try {
        parse_egress_rule(rule);
    } catch (const Error& e) {
        return e.what();
    }
    return "parsed";
}

std::string canonical(const std::string& rule)
{
    return parse_egress_rule(rule).text();
}

EgressPolicy policy(const std::vector<std::string>& allow, const std::vector<std::string>& deny = {})
{
    return EgressPolicy::parse(allow, deny);
}

// "allowed: <reason>" or "refused: <reason>", so that a CHECK shows both.
std::string verdict(const EgressDecision& decision)
{
    return (decision.allowed ? "allowed: " : "refused: ") + decision.reason;
}

std::string name_verdict(const EgressPolicy& p, const char* host, uint16_t port)
{
    return verdict(p.check_name(host, port));
}

std::string address_verdict(const EgressPolicy& p, const char* host, uint16_t port, const char* address)
{
    return verdict(p.check_address(host, port, ip(address)));
}

bool reaches(const EgressPolicy& p, const char* host, uint16_t port, const char* address)
{
    return p.check_name(host, port).allowed && p.check_address(host, port, ip(address)).allowed;
}

} // namespace

TEST_CASE("addresses parse as inet_pton takes them, and only so")
{
    CHECK(ip("10.1.2.3").is_v4());
    CHECK(ip("10.1.2.3").text() == "10.1.2.3");
    CHECK_FALSE(ip("2001:db8::1").is_v4());
    CHECK(ip("2001:0DB8:0::1").text() == "2001:db8::1");
    CHECK(ip("::ffff:10.1.2.3").text() == "::ffff:10.1.2.3");
    // inet_aton's shorthands would let 127.1 or 0x7f000001 pass for a name.
    for (const char* bad : {"", "127.1", "0x7f000001", "2130706433", "[::1]", "fe80::1%eth0", "1.2.3.4.5", "pypi.org",
                            "10.0.0.0/8", " 1.2.3.4"})
        CHECK_MESSAGE(!IpAddress::parse(bad), std::string(bad));

    in_addr v4{};
    REQUIRE(inet_pton(AF_INET, "192.168.1.7", &v4) == 1);
    CHECK(IpAddress(v4) == ip("192.168.1.7"));
    CHECK(classify_address(v4).kind == AddressClass::private_use);
    in6_addr v6{};
    REQUIRE(inet_pton(AF_INET6, "fe80::1", &v6) == 1);
    CHECK(IpAddress(v6) == ip("fe80::1"));
    CHECK(classify_address(v6).kind == AddressClass::link_local);
    CHECK(IpAddress::v4(8, 8, 4, 4) == ip("8.8.4.4"));
    const uint8_t four[] = {10, 0, 0, 1};
    CHECK(IpAddress::from_bytes(four) == ip("10.0.0.1"));
    CHECK(IpAddress::from_bytes(ip("fe80::1").bytes()) == ip("fe80::1"));
    CHECK_FALSE(IpAddress::from_bytes(std::span<const uint8_t>(four, 3)));

    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr = v4;
    CHECK(IpAddress::from_sockaddr(reinterpret_cast<const sockaddr*>(&in), sizeof in) == ip("192.168.1.7"));
    CHECK_FALSE(IpAddress::from_sockaddr(reinterpret_cast<const sockaddr*>(&in), sizeof in - 1));
    sockaddr_in6 in6{};
    in6.sin6_family = AF_INET6;
    in6.sin6_addr = v6;
    CHECK(IpAddress::from_sockaddr(reinterpret_cast<const sockaddr*>(&in6), sizeof in6) == ip("fe80::1"));
    sockaddr unix_family{};
    unix_family.sa_family = AF_UNIX;
    CHECK_FALSE(IpAddress::from_sockaddr(&unix_family, sizeof unix_family));
    CHECK_FALSE(IpAddress::from_sockaddr(nullptr, 0));
}

TEST_CASE("a prefix contains its own family's addresses with the same leading bits")
{
    const IpPrefix ten{ip("10.0.0.0"), 8};
    CHECK(ten.contains(ip("10.255.0.1")));
    CHECK_FALSE(ten.contains(ip("11.0.0.0")));
    CHECK_FALSE(ten.contains(ip("::ffff:10.0.0.1")));  // the family differs; rules look inside (below)
    const IpPrefix odd{ip("172.16.0.0"), 12};
    CHECK(odd.contains(ip("172.31.255.255")));
    CHECK_FALSE(odd.contains(ip("172.32.0.0")));
    CHECK(IpPrefix{ip("0.0.0.0"), 0}.contains(ip("255.1.2.3")));
    CHECK(ten.contains(IpPrefix{ip("10.1.0.0"), 16}));
    CHECK_FALSE(ten.contains(IpPrefix{ip("0.0.0.0"), 0}));
    CHECK(ten.text() == "10.0.0.0/8");
    CHECK(IpPrefix{ip("fd00::"), 8}.text() == "fd00::/8");
    CHECK(IpPrefix{ip("1.2.3.4"), 32}.text() == "1.2.3.4");
}

TEST_CASE("every special IPv4 range is named, and the rest is public")
{
    struct Case {
        const char* address;
        AddressClass kind;
        const char* block;
    };
    const Case cases[] = {
        {"0.0.0.0", AddressClass::unspecified, "0.0.0.0/8"},
        {"0.1.2.3", AddressClass::unspecified, "0.0.0.0/8"},
        {"127.0.0.1", AddressClass::loopback, "127.0.0.0/8"},
        {"127.255.255.254", AddressClass::loopback, "127.0.0.0/8"},
        {"10.1.2.3", AddressClass::private_use, "10.0.0.0/8"},
        {"172.16.0.1", AddressClass::private_use, "172.16.0.0/12"},
        {"172.31.255.255", AddressClass::private_use, "172.16.0.0/12"},
        {"192.168.1.1", AddressClass::private_use, "192.168.0.0/16"},
        {"169.254.1.1", AddressClass::link_local, "169.254.0.0/16"},
        {"169.254.169.254", AddressClass::metadata, "169.254.169.254"},
        {"169.254.170.2", AddressClass::metadata, "169.254.170.2"},
        {"100.100.100.200", AddressClass::metadata, "100.100.100.200"},
        {"168.63.129.16", AddressClass::metadata, "168.63.129.16"},
        {"100.64.0.1", AddressClass::carrier_grade_nat, "100.64.0.0/10"},
        {"100.127.255.255", AddressClass::carrier_grade_nat, "100.64.0.0/10"},
        {"224.0.0.251", AddressClass::multicast, "224.0.0.0/4"},
        {"239.255.255.250", AddressClass::multicast, "224.0.0.0/4"},
        {"255.255.255.255", AddressClass::broadcast, "255.255.255.255"},
        {"240.0.0.1", AddressClass::reserved, "240.0.0.0/4"},
        {"192.0.0.8", AddressClass::reserved, "192.0.0.0/24"},
        {"192.88.99.1", AddressClass::reserved, "192.88.99.0/24"},
        {"192.0.2.1", AddressClass::documentation, "192.0.2.0/24"},
        {"198.51.100.7", AddressClass::documentation, "198.51.100.0/24"},
        {"203.0.113.9", AddressClass::documentation, "203.0.113.0/24"},
        {"198.18.0.1", AddressClass::benchmarking, "198.18.0.0/15"},
        {"198.19.255.255", AddressClass::benchmarking, "198.18.0.0/15"},
    };
    for (const Case& c : cases) {
        const AddressClassification got = classify_address(ip(c.address));
        CHECK_MESSAGE(got.kind == c.kind, std::string(c.address));
        CHECK_MESSAGE(got.block.text() == c.block, std::string(c.address));
        CHECK_MESSAGE(got.special(), std::string(c.address));
        CHECK_FALSE(got.embedded_v4);
    }
    for (const char* public_address : {"8.8.8.8", "1.1.1.1", "151.101.0.223", "9.255.255.255", "11.0.0.0",
                                       "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0",
                                       "169.253.255.255", "192.167.255.255", "198.17.255.255", "223.255.255.255",
                                       "168.63.129.17", "1.0.0.0"})
        CHECK_MESSAGE(class_of(public_address) == AddressClass::global, std::string(public_address));
    CHECK(std::string(address_class_name(AddressClass::global)) == "public");
    CHECK(std::string(address_class_name(AddressClass::metadata)) == "cloud metadata");
}

TEST_CASE("every special IPv6 range is named, and the rest of 2000::/3 is public")
{
    struct Case {
        const char* address;
        AddressClass kind;
        const char* block;
    };
    const Case cases[] = {
        {"::", AddressClass::unspecified, "::"},
        {"::1", AddressClass::loopback, "::1"},
        {"fc00::1", AddressClass::private_use, "fc00::/7"},
        {"fd12:3456::1", AddressClass::private_use, "fc00::/7"},
        {"fd00:ec2::254", AddressClass::metadata, "fd00:ec2::254"},
        {"fe80::1", AddressClass::link_local, "fe80::/10"},
        {"febf::1", AddressClass::link_local, "fe80::/10"},
        {"ff02::1", AddressClass::multicast, "ff00::/8"},
        {"ff0e::1", AddressClass::multicast, "ff00::/8"},
        {"2001:db8::1", AddressClass::documentation, "2001:db8::/32"},
        {"3fff::1", AddressClass::documentation, "3fff::/20"},
        {"2001:2::1", AddressClass::benchmarking, "2001:2::/48"},
        {"2001::1", AddressClass::reserved, "2001::/23"},  // Teredo
        {"100::1", AddressClass::reserved, "100::/64"},
        {"64:ff9b:1::a00:1", AddressClass::reserved, "64:ff9b:1::/48"},
        {"fec0::1", AddressClass::reserved, "e000::/3"},  // site-local, deprecated
        {"4000::1", AddressClass::reserved, "4000::/3"},
        {"::2:0:0:1", AddressClass::reserved, "::/3"},
    };
    for (const Case& c : cases) {
        const AddressClassification got = classify_address(ip(c.address));
        CHECK_MESSAGE(got.kind == c.kind, std::string(c.address));
        CHECK_MESSAGE(got.block.text() == c.block, std::string(c.address));
        CHECK_FALSE(got.embedded_v4);
    }
    for (const char* public_address : {"2a04:4e42::223", "2606:4700:4700::1111", "2001:4860:4860::8888", "2001:200::1",
                                       "3ffe::1", "2002:808:808::"})
        CHECK_MESSAGE(class_of(public_address) == AddressClass::global, std::string(public_address));
    CHECK(classify_address(ip("2a04:4e42::223")).block.text() == "::/0");
    // 6to4 of 0.0.0.0 is no public address.
    CHECK(class_of("2002::") == AddressClass::unspecified);
}

TEST_CASE("an IPv6 address carrying an IPv4 one is classified by it: mapped, SIIT, compatible, NAT64, 6to4")
{
    struct Case {
        const char* address;
        AddressClass kind;
        const char* v4;
    };
    const Case cases[] = {
        {"::ffff:127.0.0.1", AddressClass::loopback, "127.0.0.1"},
        {"::ffff:0:127.0.0.1", AddressClass::loopback, "127.0.0.1"},
        {"::127.0.0.1", AddressClass::loopback, "127.0.0.1"},
        {"64:ff9b::7f00:1", AddressClass::loopback, "127.0.0.1"},
        {"2002:7f00:1::", AddressClass::loopback, "127.0.0.1"},
        {"2002:7f00:1:1234::5", AddressClass::loopback, "127.0.0.1"},
        {"::ffff:10.1.2.3", AddressClass::private_use, "10.1.2.3"},
        {"::ffff:0:a01:203", AddressClass::private_use, "10.1.2.3"},
        {"::10.1.2.3", AddressClass::private_use, "10.1.2.3"},
        {"64:ff9b::10.1.2.3", AddressClass::private_use, "10.1.2.3"},
        {"2002:a01:203::1", AddressClass::private_use, "10.1.2.3"},
        {"::ffff:169.254.169.254", AddressClass::metadata, "169.254.169.254"},
        {"::ffff:0:169.254.169.254", AddressClass::metadata, "169.254.169.254"},
        {"::169.254.169.254", AddressClass::metadata, "169.254.169.254"},
        {"64:ff9b::a9fe:a9fe", AddressClass::metadata, "169.254.169.254"},
        {"2002:a9fe:a9fe::", AddressClass::metadata, "169.254.169.254"},
        {"::ffff:0.0.0.0", AddressClass::unspecified, "0.0.0.0"},
        {"::ffff:100.64.0.1", AddressClass::carrier_grade_nat, "100.64.0.1"},
        {"::ffff:224.0.0.1", AddressClass::multicast, "224.0.0.1"},
        {"::ffff:8.8.8.8", AddressClass::global, "8.8.8.8"},
        {"64:ff9b::808:808", AddressClass::global, "8.8.8.8"},
        {"2002:808:808::1", AddressClass::global, "8.8.8.8"},
    };
    for (const Case& c : cases) {
        const IpAddress address = ip(c.address);
        const AddressClassification got = classify_address(address);
        CHECK_MESSAGE(got.kind == c.kind, std::string(c.address));
        REQUIRE_MESSAGE(got.embedded_v4, std::string(c.address));
        CHECK_MESSAGE(got.embedded_v4->text() == c.v4, std::string(c.address));
        CHECK(got.subject(address) == *got.embedded_v4);
        REQUIRE(address.embedded_v4());
        CHECK(*address.embedded_v4() == *got.embedded_v4);
    }
    // :: and ::1 are IPv6's own, not IPv4-compatible 0.0.0.0 and 0.0.0.1.
    CHECK_FALSE(ip("::").embedded_v4());
    CHECK_FALSE(ip("::1").embedded_v4());
    CHECK_FALSE(ip("10.1.2.3").embedded_v4());
    CHECK_FALSE(ip("2a04:4e42::223").embedded_v4());
    CHECK(classify_address(ip("::1")).kind == AddressClass::loopback);
}

TEST_CASE("good rules parse into their canonical text")
{
    CHECK(canonical("pypi.org") == "pypi.org");
    CHECK(canonical("PyPI.Org.") == "pypi.org");
    CHECK(canonical("pypi.org:443") == "pypi.org:443");
    CHECK(canonical("pypi.org:80,443") == "pypi.org:80,443");
    CHECK(canonical("pypi.org:8000-8100") == "pypi.org:8000-8100");
    CHECK(canonical("pypi.org:22,8000-8100,443") == "pypi.org:22,8000-8100,443");
    CHECK(canonical("pypi.org:1-65535") == "pypi.org:1-65535");
    CHECK(canonical("*.PythonHosted.org") == "*.pythonhosted.org");
    CHECK(canonical("*.pythonhosted.org:443") == "*.pythonhosted.org:443");
    CHECK(canonical("*") == "*");
    CHECK(canonical("*:443") == "*:443");
    CHECK(canonical("localhost") == "localhost");
    CHECK(canonical("xn--bcher-kva.example") == "xn--bcher-kva.example");
    CHECK(canonical("_acme.example.com") == "_acme.example.com");
    CHECK(canonical("10.0.0.0/8") == "10.0.0.0/8");
    CHECK(canonical("10.1.2.3") == "10.1.2.3");
    CHECK(canonical("10.1.2.3/32") == "10.1.2.3");
    CHECK(canonical("10.0.0.0/8:5432") == "10.0.0.0/8:5432");
    CHECK(canonical("0.0.0.0/0") == "0.0.0.0/0");
    CHECK(canonical("fd00::/8") == "fd00::/8");
    CHECK(canonical("[fd00::/8]") == "fd00::/8");
    CHECK(canonical("[fd00::/8]:443") == "[fd00::/8]:443");
    CHECK(canonical("[FD00::1]:80,443") == "[fd00::1]:80,443");
    CHECK(canonical("2001:db8:0::1") == "2001:db8::1");
    CHECK(canonical("::/0") == "::/0");
    // An IPv4-mapped range is held as the IPv4 range it is.
    CHECK(canonical("::ffff:10.0.0.0/104") == "10.0.0.0/8");
    CHECK(canonical("[::ffff:10.1.2.3]:443") == "10.1.2.3:443");

    const EgressRule wildcard = parse_egress_rule("*.pythonhosted.org:443");
    CHECK(wildcard.kind == EgressRule::Kind::wildcard);
    CHECK(wildcard.name == "pythonhosted.org");
    REQUIRE(wildcard.ports.size() == 1);
    CHECK(wildcard.ports[0].first == 443);
    CHECK(wildcard.ports[0].last == 443);
    const EgressRule range = parse_egress_rule("[fd00::/8]:8000-8100");
    CHECK(range.kind == EgressRule::Kind::range);
    CHECK(range.range.length == 8);
    CHECK(range.range.network == ip("fd00::"));
    CHECK(parse_egress_rule("*").kind == EgressRule::Kind::any);
    CHECK(parse_egress_rule("pypi.org").kind == EgressRule::Kind::name);
    CHECK(parse_egress_rule("pypi.org").ports.empty());
}

TEST_CASE("a bad rule is refused with a message naming it and what is wrong")
{
    const std::pair<std::string, std::string> cases[] = {
        {"", "egress rule '': empty"},
        {"pypi.org:", "egress rule 'pypi.org:': nothing after ':' (give ports, e.g. :443, :80,443 or :8000-8100)"},
        {":443", "egress rule ':443': no host before the ports"},
        {"pypi.org:https", "egress rule 'pypi.org:https': 'https' is not a port (1-65535)"},
        {"pypi.org:65536", "egress rule 'pypi.org:65536': '65536' is not a port (1-65535)"},
        {"pypi.org:-1", "egress rule 'pypi.org:-1': an empty port (ports are 443, 80,443 or 8000-8100)"},
        {"pypi.org:+443", "egress rule 'pypi.org:+443': '+443' is not a port (1-65535)"},
        {"pypi.org:0", "egress rule 'pypi.org:0': port 0 is not a destination port"},
        {"pypi.org:0-80", "egress rule 'pypi.org:0-80': port 0 is not a destination port"},
        {"pypi.org:80,,443", "egress rule 'pypi.org:80,,443': an empty port (ports are 443, 80,443 or 8000-8100)"},
        {"pypi.org:443,", "egress rule 'pypi.org:443,': an empty port (ports are 443, 80,443 or 8000-8100)"},
        {"pypi.org:8100-8000", "egress rule 'pypi.org:8100-8000': port range 8100-8000 is reversed"},
        {"pypi.org:80-90-100", "egress rule 'pypi.org:80-90-100': '90-100' is not a port (1-65535)"},
        {"pypi.org:443:80",
         "egress rule 'pypi.org:443:80': 'pypi.org:443:80' is neither HOST:PORTS nor an IPv6 address (an IPv6 address "
         "takes ports in brackets: [fd00::1]:443)"},
        {"10.0.0.0/33", "egress rule '10.0.0.0/33': prefix length /33 is out of range for IPv4 (0-32)"},
        {"fd00::/129", "egress rule 'fd00::/129': prefix length /129 is out of range for IPv6 (0-128)"},
        {"10.0.0.0/", "egress rule '10.0.0.0/': '' is not a prefix length"},
        {"10.0.0.0/x8", "egress rule '10.0.0.0/x8': 'x8' is not a prefix length"},
        {"10.0.0.0/-8", "egress rule '10.0.0.0/-8': '-8' is not a prefix length"},
        {"10.1.0.0/8", "egress rule '10.1.0.0/8': 10.1.0.0 has bits set past /8 (did you mean 10.0.0.0/8?)"},
        {"fd00::1/8", "egress rule 'fd00::1/8': fd00::1 has bits set past /8 (did you mean fd00::/8?)"},
        {"pypi.org/24", "egress rule 'pypi.org/24': 'pypi.org' is not an IP address (a /prefix length needs one)"},
        {"10.0.0.300", "egress rule '10.0.0.300': neither an IP address (give a dotted quad) nor a DNS name (its last "
                       "label is a number)"},
        {"127.1", "egress rule '127.1': neither an IP address (give a dotted quad) nor a DNS name (its last label is a "
                  "number)"},
        {"0x7f000001", "egress rule '0x7f000001': neither an IP address (give a dotted quad) nor a DNS name (its last "
                       "label is a number)"},
        {"[pypi.org]:443", "egress rule '[pypi.org]:443': brackets are for IPv6 addresses only"},
        {"[10.0.0.1]:443", "egress rule '[10.0.0.1]:443': brackets are for IPv6 addresses only"},
        {"[fd00::1:443", "egress rule '[fd00::1:443': a '[' without its ']'"},
        {"[fd00::1]443", "egress rule '[fd00::1]443': expected ':' and ports after ']'"},
        {"[fd00::1]:", "egress rule '[fd00::1]:': nothing after ':' (give ports, e.g. :443, :80,443 or :8000-8100)"},
        {"fe80::1%eth0", "egress rule 'fe80::1%eth0': 'fe80::1%eth0' is not an IP address (a zone index such as %eth0 "
                         "is not taken)"},
        {"*pypi.org", "egress rule '*pypi.org': a wildcard is '*.' before a domain, as in *.pythonhosted.org, or '*' "
                      "alone"},
        {"pypi.*.org", "egress rule 'pypi.*.org': a wildcard is '*.' before a domain, as in *.pythonhosted.org, or '*' "
                       "alone"},
        {"*.*.org", "egress rule '*.*.org': a wildcard is '*.' before a domain, as in *.pythonhosted.org, or '*' "
                    "alone"},
        {"*.", "egress rule '*.': the name is empty"},
        {"**", "egress rule '**': a wildcard is '*.' before a domain, as in *.pythonhosted.org, or '*' alone"},
        {"*/0", "egress rule '*/0': '*' is not an IP address (a /prefix length needs one)"},
        {"bücher.de", "egress rule 'bücher.de': a non-ASCII name: give an internationalised name as its A-label "
                      "(punycode, xn--...)"},
        {"pypi..org", "egress rule 'pypi..org': the name has an empty label (a leading dot or two dots in a row)"},
        {".pypi.org", "egress rule '.pypi.org': the name has an empty label (a leading dot or two dots in a row)"},
        {"pypi.org..", "egress rule 'pypi.org..': the name has an empty label (a leading dot or two dots in a row)"},
        {"-pypi.org", "egress rule '-pypi.org': label '-pypi' begins or ends with '-'"},
        {"py!pi.org", "egress rule 'py!pi.org': '!' is not allowed in a host name"},
        {"https://pypi.org", "egress rule 'https://pypi.org': a rule is HOST[:PORTS], not a URL"},
        {" pypi.org", "egress rule ' pypi.org': contains white space"},
        {"pypi.org :443", "egress rule 'pypi.org :443': contains white space"},
        {std::string(64, 'a') + ".org",
         "egress rule '" + std::string(64, 'a') + ".org': label '" + std::string(64, 'a') +
             "' is longer than 63 characters"},
    };
    for (const auto& [rule, message] : cases)
        CHECK(parse_error(rule) == message);

    // 253 characters at most, the longest DNS name.
    std::string longest;
    while (longest.size() + 4 <= 253)
        longest += "abc.";
    longest += std::string(253 - longest.size(), 'z');
    REQUIRE(longest.size() == 253);
    CHECK(parse_error(longest) == "parsed");
    CHECK(parse_error(longest + "z") == "egress rule '" + longest.substr(0, 40) + "...': longer than 253 characters");
}

TEST_CASE("a list holds at most 256 rules, and its errors name the list")
{
    std::vector<std::string> rules(256, "pypi.org:443");
    CHECK(parse_egress_rules(rules).size() == 256);
    rules.push_back("pypi.org");
    CHECK_THROWS_WITH_AS(EgressPolicy::parse(rules, {}), "allow rules: at most 256 a list, got 257", Error);
    CHECK_THROWS_WITH_AS(EgressPolicy::parse({}, rules), "deny rules: at most 256 a list, got 257", Error);
    CHECK_THROWS_WITH_AS(EgressPolicy::parse({"pypi.org", "pypi.org:0"}, {}),
                         "allow rule 'pypi.org:0': port 0 is not a destination port", Error);
    CHECK_THROWS_WITH_AS(EgressPolicy::parse({"*"}, {"10.0.0.0/40"}),
                         "deny rule '10.0.0.0/40': prefix length /40 is out of range for IPv4 (0-32)", Error);
}

TEST_CASE("the default policy allows nothing, and says so")
{
    const EgressPolicy none;
    CHECK_FALSE(none.allows_any());
    CHECK(none.describe() == "allow nothing");
    CHECK(name_verdict(none, "pypi.org", 443) == "refused: pypi.org:443: the egress policy allows no destination");
    CHECK(name_verdict(none, "8.8.8.8", 53) == "refused: 8.8.8.8:53: the egress policy allows no destination");
    CHECK(address_verdict(none, "pypi.org", 443, "151.101.0.223") ==
          "refused: pypi.org:443: the egress policy allows no destination");
    CHECK(address_verdict(none, "10.1.2.3", 443, "10.1.2.3") ==
          "refused: 10.1.2.3:443 is a private address, which no rule names");

    CHECK(policy({"*"}).allows_any());
    CHECK(policy({"pypi.org"}, {"*:22"}).allows_any());
    CHECK_FALSE(policy({"pypi.org"}, {"*"}).allows_any());
    CHECK(policy({"pypi.org:443", "*.pythonhosted.org", "[fd00::/8]:80"}, {"10.9.0.0/16", "*:25"}).describe() ==
          "allow pypi.org:443, *.pythonhosted.org, [fd00::/8]:80; deny 10.9.0.0/16, *:25");
    CHECK(policy({}, {"10.0.0.0/8"}).describe() == "allow nothing; deny 10.0.0.0/8");
}

TEST_CASE("a name rule matches that name only; a wildcard its subdomains at any depth, not the bare domain")
{
    const EgressPolicy p = policy({"pypi.org", "*.pythonhosted.org"});
    CHECK(p.check_name("pypi.org", 443));
    CHECK_FALSE(p.check_name("www.pypi.org", 443));
    CHECK_FALSE(p.check_name("pypi.org.evil.com", 443));
    CHECK_FALSE(p.check_name("notpypi.org", 443));
    CHECK(p.check_name("files.pythonhosted.org", 443));
    CHECK(p.check_name("a.b.c.pythonhosted.org", 443));
    CHECK_FALSE(p.check_name("pythonhosted.org", 443));
    CHECK_FALSE(p.check_name("evilpythonhosted.org", 443));
    CHECK_FALSE(p.check_name("pythonhosted.org.evil.com", 443));
    CHECK(name_verdict(p, "pythonhosted.org", 443) ==
          "refused: pythonhosted.org:443: no rule allows pythonhosted.org (allowed: pypi.org, *.pythonhosted.org)");
    CHECK(name_verdict(p, "files.pythonhosted.org", 443) ==
          "allowed: files.pythonhosted.org:443: allowed by rule '*.pythonhosted.org'");

    const EgressPolicy both = policy({"pythonhosted.org", "*.pythonhosted.org"});
    CHECK(both.check_name("pythonhosted.org", 443));
    CHECK(both.check_name("files.pythonhosted.org", 443));

    const EgressRule rule = parse_egress_rule("*.b.org");
    CHECK(rule.matches_name("a.b.org"));
    CHECK(rule.matches_name("x.a.b.org"));
    CHECK_FALSE(rule.matches_name("b.org"));
    CHECK_FALSE(rule.matches_name(".b.org"));
    CHECK_FALSE(rule.matches_name("ab.org"));
}

TEST_CASE("names are compared lower-case, a trailing dot ignored, on rules and hosts alike")
{
    const EgressPolicy p = policy({"PyPI.org.", "*.PythonHosted.ORG"});
    CHECK(p.check_name("pypi.org", 443));
    CHECK(p.check_name("PYPI.ORG", 443));
    CHECK(p.check_name("pypi.org.", 443));
    CHECK(p.check_name("Files.PythonHosted.Org.", 443));
    CHECK(name_verdict(p, "PyPI.Org.", 443) == "allowed: pypi.org:443: allowed by rule 'pypi.org'");
    CHECK_FALSE(p.check_name("pypi.org..", 443));
    CHECK(name_verdict(p, "bücher.de", 443) ==
          "refused: 'bücher.de' is not a host to connect to: a non-ASCII name: give an internationalised name as its "
          "A-label (punycode, xn--...)");
    CHECK(name_verdict(p, "", 443) == "refused: '' is not a host to connect to: the name is empty");
}

TEST_CASE("ports: one, a list, a range, or any; a refusal says which ports the name has")
{
    const EgressPolicy p = policy({"example.com:443", "api.example.com:80,443", "dev.example.com:8000-8100",
                                   "any.example.com"});
    CHECK(p.check_name("example.com", 443));
    CHECK(name_verdict(p, "example.com", 22) ==
          "refused: example.com:22: port 22 is not allowed by any rule (example.com allows 443)");
    CHECK(p.check_name("api.example.com", 80));
    CHECK(p.check_name("api.example.com", 443));
    CHECK_FALSE(p.check_name("api.example.com", 8080));
    CHECK(p.check_name("dev.example.com", 8000));
    CHECK(p.check_name("dev.example.com", 8050));
    CHECK(p.check_name("dev.example.com", 8100));
    CHECK_FALSE(p.check_name("dev.example.com", 7999));
    CHECK(name_verdict(p, "dev.example.com", 8101) ==
          "refused: dev.example.com:8101: port 8101 is not allowed by any rule (dev.example.com allows 8000-8100)");
    CHECK(p.check_name("any.example.com", 1));
    CHECK(p.check_name("any.example.com", 65535));
    CHECK(name_verdict(p, "example.com", 0) == "refused: example.com:0: port 0 is not a destination port");

    const EgressPolicy two = policy({"example.com:443", "*.com:80"});
    CHECK(name_verdict(two, "example.com", 22) ==
          "refused: example.com:22: port 22 is not allowed by any rule (example.com allows 443; *.com allows 80)");
    // The port is checked again with the address: the address step alone is a whole decision.
    CHECK(address_verdict(two, "example.com", 22, "93.184.216.34") ==
          "refused: example.com:22: port 22 is not allowed by any rule (example.com allows 443; *.com allows 80)");
}

TEST_CASE("deny beats allow, by name, wildcard, range and port")
{
    const EgressPolicy p = policy({"*", "10.0.0.0/8"}, {"evil.com", "*.tracker.net", "1.2.3.0/24", "10.9.0.0/16",
                                                        "*:25", "[2001:4860::/32]"});
    CHECK(p.allows_any());
    CHECK(name_verdict(p, "evil.com", 443) == "refused: evil.com:443 is refused by deny rule 'evil.com'");
    CHECK(p.check_name("www.evil.com", 443));  // a name rule is that name only
    CHECK(name_verdict(p, "a.b.tracker.net", 443) ==
          "refused: a.b.tracker.net:443 is refused by deny rule '*.tracker.net'");
    CHECK(p.check_name("tracker.net", 443));
    CHECK(name_verdict(p, "smtp.example.com", 25) == "refused: smtp.example.com:25 is refused by deny rule '*:25'");
    CHECK(address_verdict(p, "evil.com", 443, "93.184.216.34") ==
          "refused: evil.com:443 is refused by deny rule 'evil.com'");

    CHECK(address_verdict(p, "example.com", 443, "1.2.3.4") ==
          "refused: example.com:443 resolves to 1.2.3.4, which deny rule '1.2.3.0/24' refuses");
    CHECK(address_verdict(p, "example.com", 443, "1.2.4.4") ==
          "allowed: example.com:443 resolves to 1.2.4.4: allowed by rule '*'");
    // The deny range inside an allowed special range wins over it.
    CHECK(address_verdict(p, "db.internal", 5432, "10.1.2.3") ==
          "allowed: db.internal:5432 resolves to 10.1.2.3, a private address, allowed by rule '10.0.0.0/8'");
    CHECK(address_verdict(p, "db.internal", 5432, "10.9.2.3") ==
          "refused: db.internal:5432 resolves to 10.9.2.3, which deny rule '10.9.0.0/16' refuses");
    // An IPv4 deny range holds the IPv6 forms of its addresses.
    for (const char* v6 : {"::ffff:1.2.3.4", "64:ff9b::102:304", "2002:102:304::1", "::1.2.3.4"})
        CHECK_MESSAGE(!p.check_address("example.com", 443, ip(v6)), std::string(v6));
    CHECK(address_verdict(p, "dns.google", 443, "2001:4860:4860::8888") ==
          "refused: dns.google:443 resolves to 2001:4860:4860::8888, which deny rule '2001:4860::/32' refuses");
    // A literal address in a deny range.
    CHECK(name_verdict(p, "1.2.3.9", 443) == "refused: 1.2.3.9:443 is refused by deny rule '1.2.3.0/24'");
    CHECK(name_verdict(p, "[::ffff:1.2.3.9]", 443) ==
          "refused: [::ffff:1.2.3.9]:443 is refused by deny rule '1.2.3.0/24'");
    CHECK(name_verdict(p, "8.8.8.8", 25) == "refused: 8.8.8.8:25 is refused by deny rule '*:25'");

    const EgressPolicy all_denied = policy({"pypi.org"}, {"*"});
    CHECK(name_verdict(all_denied, "pypi.org", 443) == "refused: pypi.org:443 is refused by deny rule '*'");
    CHECK_FALSE(all_denied.check_name("8.8.8.8", 443));
}

TEST_CASE("* allows any public destination and no special one")
{
    const EgressPolicy p = policy({"*"});
    CHECK(name_verdict(p, "example.com", 443) == "allowed: example.com:443: allowed by rule '*'");
    CHECK(reaches(p, "example.com", 443, "93.184.216.34"));
    CHECK(reaches(p, "example.com", 443, "2606:2800:220:1:248:1893:25c8:1946"));
    CHECK(name_verdict(p, "8.8.8.8", 53) == "allowed: 8.8.8.8:53: allowed by rule '*'");
    CHECK(name_verdict(p, "[2001:4860:4860::8888]", 443) ==
          "allowed: [2001:4860:4860::8888]:443: allowed by rule '*'");

    struct Case {
        const char* address;
        const char* phrase;
    };
    const Case special[] = {
        {"127.0.0.1", "a loopback address"},
        {"0.0.0.0", "an unspecified address"},
        {"10.1.2.3", "a private address"},
        {"172.20.0.1", "a private address"},
        {"192.168.0.1", "a private address"},
        {"169.254.1.1", "a link-local address"},
        {"169.254.169.254", "a cloud metadata address"},
        {"100.64.1.1", "a carrier-grade NAT address"},
        {"224.0.0.1", "a multicast address"},
        {"255.255.255.255", "the broadcast address"},
        {"240.0.0.1", "a reserved address"},
        {"192.0.2.1", "a documentation address"},
        {"198.18.0.1", "a benchmarking address"},
        {"::1", "a loopback address"},
        {"::", "an unspecified address"},
        {"fd12::1", "a private address"},
        {"fe80::1", "a link-local address"},
        {"fd00:ec2::254", "a cloud metadata address"},
        {"ff02::1", "a multicast address"},
        {"2001:db8::1", "a documentation address"},
    };
    for (const Case& c : special) {
        const std::string expected =
            std::string("refused: example.com:443 resolves to ") + c.address + ", " + c.phrase + ", which no rule names";
        CHECK(address_verdict(p, "example.com", 443, c.address) == expected);
    }
    CHECK(address_verdict(p, "localhost", 443, "127.0.0.1") ==
          "refused: localhost:443 resolves to 127.0.0.1, a loopback address, which no rule names");
    CHECK(name_verdict(p, "127.0.0.1", 8080) == "refused: 127.0.0.1:8080 is a loopback address, which no rule names");
    CHECK(name_verdict(p, "[::1]", 8080) == "refused: [::1]:8080 is a loopback address, which no rule names");
}

TEST_CASE("the IPv6 forms of 127.0.0.1, 10.x and 169.254.169.254 are special through the IPv4 they carry")
{
    const EgressPolicy p = policy({"*"});
    const char* forms[] = {
        "::ffff:127.0.0.1", "::ffff:0:127.0.0.1", "::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::",
        "::ffff:10.1.2.3", "::ffff:0:10.1.2.3", "::10.1.2.3", "64:ff9b::a01:203", "2002:a01:203::",
        "::ffff:169.254.169.254", "::ffff:0:169.254.169.254", "::169.254.169.254", "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::",
    };
    for (const char* form : forms) {
        CHECK_MESSAGE(!p.check_address("example.com", 443, ip(form)), std::string(form));
        CHECK_MESSAGE(!p.check_name((std::string("[") + form + "]").c_str(), 443), std::string(form));
    }
    CHECK(address_verdict(p, "example.com", 443, "::ffff:169.254.169.254") ==
          "refused: example.com:443 resolves to ::ffff:169.254.169.254 (IPv4 169.254.169.254), a cloud metadata "
          "address, which no rule names");
    CHECK(address_verdict(p, "example.com", 443, "64:ff9b::a01:203") ==
          "refused: example.com:443 resolves to 64:ff9b::a01:203 (IPv4 10.1.2.3), a private address, which no rule "
          "names");
    CHECK(name_verdict(p, "[2002:7f00:1::]", 80) ==
          "refused: [2002:7f00:1::]:80 carries IPv4 127.0.0.1, a loopback address, which no rule names");
    // A public IPv4 address carried in IPv6 is public.
    CHECK(p.check_address("example.com", 443, ip("64:ff9b::808:808")));
    CHECK(p.check_address("example.com", 443, ip("::ffff:8.8.8.8")));

    // The IPv4 range that names 10.1.2.3 names it in every form.
    const EgressPolicy ten = policy({"10.0.0.0/8"});
    for (const char* form : {"10.1.2.3", "::ffff:10.1.2.3", "::ffff:0:10.1.2.3", "::10.1.2.3", "64:ff9b::a01:203",
                             "2002:a01:203::"})
        CHECK_MESSAGE(ten.check_address("db.internal", 5432, ip(form)), std::string(form));
}

TEST_CASE("a range rule inside a special range names it; * and wider ranges do not")
{
    const EgressPolicy star = policy({"*"});
    const EgressPolicy ten = policy({"10.0.0.0/8"});
    const EgressPolicy both = policy({"*", "10.0.0.0/8:5432"});
    CHECK_FALSE(star.check_address("db.internal", 5432, ip("10.1.2.3")));
    CHECK(ten.check_name("db.internal", 5432));
    CHECK(address_verdict(ten, "db.internal", 5432, "10.1.2.3") ==
          "allowed: db.internal:5432 resolves to 10.1.2.3, a private address, allowed by rule '10.0.0.0/8'");
    CHECK(name_verdict(ten, "10.1.2.3", 5432) ==
          "allowed: 10.1.2.3:5432 is a private address, allowed by rule '10.0.0.0/8'");
    CHECK(ten.check_name("10.255.255.255", 1));
    CHECK_FALSE(ten.check_name("11.0.0.1", 443));
    CHECK_FALSE(ten.check_name("192.168.1.1", 443));
    // A name that only an address rule could allow waits for its addresses.
    CHECK(name_verdict(ten, "example.com", 443) ==
          "allowed: example.com:443: its addresses decide (rule '10.0.0.0/8' and other address rules)");
    CHECK(address_verdict(ten, "example.com", 443, "93.184.216.34") ==
          "refused: example.com:443 resolves to 93.184.216.34, which no rule allows");
    CHECK(both.check_address("db.internal", 5432, ip("10.1.2.3")));
    CHECK(address_verdict(both, "db.internal", 22, "10.1.2.3") ==
          "refused: db.internal:22: port 22 is not allowed by any rule (10.0.0.0/8 allows 5432)");

    CHECK(address_verdict(policy({"0.0.0.0/0"}), "db.internal", 443, "10.1.2.3") ==
          "refused: db.internal:443 resolves to 10.1.2.3, a private address, which no rule names ('0.0.0.0/0' is wider "
          "than 10.0.0.0/8 and does not name it)");
    CHECK(policy({"0.0.0.0/0"}).check_address("example.com", 443, ip("93.184.216.34")));
    CHECK_FALSE(policy({"8.0.0.0/5"}).check_name("10.1.2.3", 443));
    CHECK_FALSE(policy({"::/0"}).check_name("[fd00::1]", 443));
    CHECK(policy({"fd00::/8"}).check_name("[fd00::1]", 443));
    CHECK(policy({"[fd12:3456::/32]:443"}).check_name("[fd12:3456::7]", 443));
    CHECK(policy({"127.0.0.1:8080"}).check_name("127.0.0.1", 8080));
    CHECK_FALSE(policy({"127.0.0.1:8080"}).check_name("127.0.0.2", 8080));
    CHECK(policy({"::1"}).check_name("[::1]", 8080));
    CHECK(policy({"172.16.0.0/12"}).check_name("172.31.0.1", 443));
    CHECK(policy({"100.64.0.0/10"}).check_name("100.64.0.1", 443));

    // The metadata address is named apart: the link-local range, the CGNAT range, fc00::/7 do not name it.
    CHECK(policy({"169.254.0.0/16"}).check_name("169.254.1.1", 80));
    CHECK(name_verdict(policy({"169.254.0.0/16"}), "169.254.169.254", 80) ==
          "refused: 169.254.169.254:80 is a cloud metadata address, which no rule names ('169.254.0.0/16' is wider "
          "than 169.254.169.254 and does not name it)");
    CHECK(name_verdict(policy({"169.254.169.254:80"}), "169.254.169.254", 80) ==
          "allowed: 169.254.169.254:80 is a cloud metadata address, allowed by rule '169.254.169.254:80'");
    CHECK(address_verdict(policy({"169.254.169.254"}), "metadata.google.internal", 80, "169.254.169.254") ==
          "allowed: metadata.google.internal:80 resolves to 169.254.169.254, a cloud metadata address, allowed by rule "
          "'169.254.169.254'");
    CHECK_FALSE(policy({"100.64.0.0/10"}).check_name("100.100.100.200", 80));
    CHECK_FALSE(policy({"fc00::/7"}).check_name("[fd00:ec2::254]", 80));
    CHECK(policy({"fd00:ec2::254"}).check_name("[fd00:ec2::254]", 80));

    // A name rule never allows a special address, whatever the name.
    const EgressPolicy named = policy({"metadata.google.internal", "localhost", "db.internal"});
    CHECK(named.check_name("metadata.google.internal", 80));
    CHECK(address_verdict(named, "metadata.google.internal", 80, "169.254.169.254") ==
          "refused: metadata.google.internal:80 resolves to 169.254.169.254, a cloud metadata address, which no rule "
          "names");
    CHECK_FALSE(named.check_address("localhost", 80, ip("127.0.0.1")));
    CHECK_FALSE(named.check_address("localhost", 80, ip("::1")));
    CHECK_FALSE(named.check_address("db.internal", 5432, ip("10.1.2.3")));
}

TEST_CASE("a name resolving to public and private addresses: each address decided alone")
{
    const EgressPolicy p = policy({"pypi.org:443"});
    CHECK(p.check_name("pypi.org", 443));
    CHECK(address_verdict(p, "pypi.org", 443, "151.101.0.223") ==
          "allowed: pypi.org:443 resolves to 151.101.0.223: allowed by rule 'pypi.org:443'");
    CHECK(address_verdict(p, "pypi.org", 443, "10.1.2.3") ==
          "refused: pypi.org:443 resolves to 10.1.2.3, a private address, which no rule names");
    CHECK(p.check_address("pypi.org", 443, ip("2a04:4e42::223")));
    CHECK_FALSE(p.check_address("pypi.org", 443, ip("fe80::1")));
    CHECK_FALSE(p.check_address("pypi.org", 443, ip("::ffff:127.0.0.1")));
    CHECK(p.check_address("pypi.org", 443, ip("151.101.64.223")));
    // The name step refuses for the address step too: a wrong name or port fails at either.
    CHECK_FALSE(p.check_address("evil.com", 443, ip("151.101.0.223")));
    CHECK_FALSE(p.check_address("pypi.org", 80, ip("151.101.0.223")));
}

TEST_CASE("a literal IP host goes by the address rules, not by names")
{
    const EgressPolicy names = policy({"pypi.org", "*.pythonhosted.org"});
    CHECK(name_verdict(names, "151.101.0.223", 443) ==
          "refused: 151.101.0.223:443: no rule allows 151.101.0.223 (allowed: pypi.org, *.pythonhosted.org)");
    const EgressPolicy range = policy({"151.101.0.0/16:443"});
    CHECK(name_verdict(range, "151.101.0.223", 443) ==
          "allowed: 151.101.0.223:443: allowed by rule '151.101.0.0/16:443'");
    CHECK(name_verdict(range, "151.101.0.223", 80) ==
          "refused: 151.101.0.223:80: port 80 is not allowed by any rule (151.101.0.0/16 allows 443)");
    CHECK(range.check_address("151.101.0.223", 443, ip("151.101.0.223")));
    // The literal decides, and so does any other address the proxy is handed for it.
    CHECK_FALSE(range.check_address("151.101.0.223", 443, ip("10.1.2.3")));
    CHECK(name_verdict(range, "[::ffff:151.101.0.223]", 443) ==
          "allowed: [::ffff:151.101.0.223]:443: allowed by rule '151.101.0.0/16:443'");
    CHECK(name_verdict(policy({"[2a04:4e42::/32]:443"}), "[2a04:4e42::223]", 443) ==
          "allowed: [2a04:4e42::223]:443: allowed by rule '[2a04:4e42::/32]:443'");
    CHECK(name_verdict(policy({"*"}), "2a04:4e42::223", 443) == "allowed: [2a04:4e42::223]:443: allowed by rule '*'");
    // A numeric shorthand getaddrinfo would take for 127.0.0.1 is no host.
    for (const char* shorthand : {"127.1", "2130706433", "0x7f000001", "0177.0.0.1"})
        CHECK_MESSAGE(!policy({"*"}).check_name(shorthand, 80), std::string(shorthand));
    CHECK(name_verdict(policy({"*"}), "127.1", 80) ==
          "refused: '127.1' is not a host to connect to: neither an IP address (give a dotted quad) nor a DNS name (its "
          "last label is a number)");
    CHECK(name_verdict(policy({"*"}), "[pypi.org]", 80) ==
          "refused: '[pypi.org]' is not a host to connect to: brackets hold an IPv6 address only");
    CHECK_FALSE(policy({"*"}).check_name("[10.1.2.3]", 80));
    CHECK_FALSE(policy({"*"}).check_name("fe80::1%eth0", 80));
}

TEST_CASE("what a message quotes of a rule or host is printable, valid UTF-8 and bounded")
{
    CHECK(parse_error("py\npi.org") == "egress rule 'py\\x0api.org': contains white space");
    CHECK(parse_error(std::string("py\0pi.org", 9)) == "egress rule 'py\\x00pi.org': '\\x00' is not allowed in a host name");
    CHECK(parse_error("b\xfcher.de") ==
          "egress rule 'b\\xfcher.de': a non-ASCII name: give an internationalised name as its A-label (punycode, "
          "xn--...)");
    // Cut at 40 bytes inside a two-byte character: the character goes, not half of it.
    const std::string long_rule = std::string(39, 'a') + "\xc3\xbc" + std::string(250, 'b');
    CHECK(parse_error(long_rule) == "egress rule '" + std::string(39, 'a') + "\xc3\xbc...': longer than 253 characters");
    const std::string guest_host = "\x1b[31m" + std::string(300, 'x') + "\xff";
    const EgressDecision decision = policy({"*"}).check_name(guest_host, 443);
    CHECK_FALSE(decision);
    CHECK(decision.reason == "'\\x1b[31m" + std::string(95, 'x') + "...' is not a host to connect to: a non-ASCII "
                             "name: give an internationalised name as its A-label (punycode, xn--...)");
    CHECK(policy({"*"}).check_name("\x1b[31m.com", 443).reason ==
          "'\\x1b[31m.com' is not a host to connect to: '\\x1b' is not allowed in a host name");
}
