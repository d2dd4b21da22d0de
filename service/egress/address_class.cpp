#include "service/egress/address_class.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace agentvm {

IpAddress::IpAddress(const in_addr& address)
{
    std::memcpy(bytes_.data(), &address.s_addr, 4);
    size_ = 4;
}

IpAddress::IpAddress(const in6_addr& address)
{
    std::memcpy(bytes_.data(), address.s6_addr, 16);
    size_ = 16;
}

IpAddress IpAddress::v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
    IpAddress address;
    address.bytes_[0] = a;
    address.bytes_[1] = b;
    address.bytes_[2] = c;
    address.bytes_[3] = d;
    return address;
}

std::optional<IpAddress> IpAddress::parse(std::string_view text)
{
    // inet_pton wants a C string; an address is at most INET6_ADDRSTRLEN - 1 characters.
    if (text.empty() || text.size() >= INET6_ADDRSTRLEN)
        return std::nullopt;
    char buffer[INET6_ADDRSTRLEN] = {};
    std::memcpy(buffer, text.data(), text.size());
    in_addr v4{};
    if (inet_pton(AF_INET, buffer, &v4) == 1)
        return IpAddress(v4);
    in6_addr v6{};
    if (inet_pton(AF_INET6, buffer, &v6) == 1)
        return IpAddress(v6);
    return std::nullopt;
}

std::optional<IpAddress> IpAddress::from_bytes(std::span<const uint8_t> bytes)
{
    if (bytes.size() != 4 && bytes.size() != 16)
        return std::nullopt;
    IpAddress address;
    std::copy(bytes.begin(), bytes.end(), address.bytes_.begin());
    address.size_ = static_cast<uint8_t>(bytes.size());
    return address;
}

std::optional<IpAddress> IpAddress::from_sockaddr(const sockaddr* address, socklen_t length)
{
    if (!address)
        return std::nullopt;
    if (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
        sockaddr_in in{};
        std::memcpy(&in, address, sizeof in);
        return IpAddress(in.sin_addr);
    }
    if (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
        sockaddr_in6 in6{};
        std::memcpy(&in6, address, sizeof in6);
        return IpAddress(in6.sin6_addr);
    }
    return std::nullopt;
}

std::string IpAddress::text() const
{
    char buffer[INET6_ADDRSTRLEN] = {};
    inet_ntop(is_v4() ? AF_INET : AF_INET6, bytes_.data(), buffer, sizeof buffer);
    return buffer;
}

namespace {

bool same_leading_bits(std::span<const uint8_t> a, std::span<const uint8_t> b, unsigned bits)
{
    const unsigned whole = bits / 8;
    if (std::memcmp(a.data(), b.data(), whole) != 0)
        return false;
    const unsigned rest = bits % 8;
    if (rest == 0)
        return true;
    const auto mask = static_cast<uint8_t>(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

IpPrefix prefix_of(const char* text, unsigned length)
{
    // The tables below are literals: a typo is a programming error, caught by the unit test.
    return IpPrefix{IpAddress::parse(text).value_or(IpAddress{}), length};
}

// The prefixes under which an IPv6 address carries an IPv4 one, and where.
struct Embedding {
    IpPrefix prefix;
    size_t offset;  // of the IPv4 address's four bytes
};

const std::vector<Embedding>& embeddings()
{
    static const std::vector<Embedding> table = {
        {prefix_of("::ffff:0:0", 96), 12},    // IPv4-mapped (RFC 4291)
        {prefix_of("::ffff:0:0:0", 96), 12},  // IPv4-translated, SIIT (RFC 7915)
        {prefix_of("64:ff9b::", 96), 12},     // NAT64 well-known prefix (RFC 6052)
        {prefix_of("2002::", 16), 2},         // 6to4 (RFC 3056)
        {prefix_of("::", 96), 12},            // IPv4-compatible, deprecated; :: and ::1 are caught first
    };
    return table;
}

struct Range {
    IpPrefix prefix;
    AddressClass kind;
};

// Most specific first: the first range that contains the address gives its class.
const std::vector<Range>& v4_ranges()
{
    static const std::vector<Range> ranges = {
        // Instance metadata, named apart from the range each lies in: a rule naming 169.254/16
        // or 100.64/10 does not name these.
        {prefix_of("169.254.169.254", 32), AddressClass::metadata},  // AWS, GCP, Azure, OCI, ...
        {prefix_of("169.254.170.2", 32), AddressClass::metadata},    // AWS ECS task metadata
        {prefix_of("100.100.100.200", 32), AddressClass::metadata},  // Alibaba Cloud
        {prefix_of("168.63.129.16", 32), AddressClass::metadata},    // Azure WireServer, a public address
        {prefix_of("255.255.255.255", 32), AddressClass::broadcast},
        {prefix_of("0.0.0.0", 8), AddressClass::unspecified},
        {prefix_of("10.0.0.0", 8), AddressClass::private_use},
        {prefix_of("100.64.0.0", 10), AddressClass::carrier_grade_nat},
        {prefix_of("127.0.0.0", 8), AddressClass::loopback},
        {prefix_of("169.254.0.0", 16), AddressClass::link_local},
        {prefix_of("172.16.0.0", 12), AddressClass::private_use},
        {prefix_of("192.0.0.0", 24), AddressClass::reserved},  // IETF protocol assignments
        {prefix_of("192.0.2.0", 24), AddressClass::documentation},
        {prefix_of("192.88.99.0", 24), AddressClass::reserved},  // 6to4 relay anycast, deprecated
        {prefix_of("192.168.0.0", 16), AddressClass::private_use},
        {prefix_of("198.18.0.0", 15), AddressClass::benchmarking},
        {prefix_of("198.51.100.0", 24), AddressClass::documentation},
        {prefix_of("203.0.113.0", 24), AddressClass::documentation},
        {prefix_of("224.0.0.0", 4), AddressClass::multicast},
        {prefix_of("240.0.0.0", 4), AddressClass::reserved},
    };
    return ranges;
}

// IPv6 addresses that carry an IPv4 one are classified by it before this table is consulted.
const std::vector<Range>& v6_ranges()
{
    static const std::vector<Range> ranges = {
        {prefix_of("::", 128), AddressClass::unspecified},
        {prefix_of("::1", 128), AddressClass::loopback},
        {prefix_of("fd00:ec2::254", 128), AddressClass::metadata},  // AWS IMDS over IPv6
        {prefix_of("fc00::", 7), AddressClass::private_use},        // unique local
        {prefix_of("fe80::", 10), AddressClass::link_local},
        {prefix_of("ff00::", 8), AddressClass::multicast},
        {prefix_of("100::", 64), AddressClass::reserved},        // discard-only
        {prefix_of("64:ff9b:1::", 48), AddressClass::reserved},  // local-use NAT64, not decoded
        {prefix_of("2001:db8::", 32), AddressClass::documentation},
        {prefix_of("3fff::", 20), AddressClass::documentation},
        {prefix_of("2001:2::", 48), AddressClass::benchmarking},
        {prefix_of("2001::", 23), AddressClass::reserved},  // IETF protocol assignments, Teredo among them
    };
    return ranges;
}

IpPrefix whole_space(const IpAddress& address)
{
    return address.is_v4() ? IpPrefix{IpAddress{}, 0} : prefix_of("::", 0);
}

AddressClassification classify_in(const std::vector<Range>& ranges, const IpAddress& address)
{
    for (const Range& range : ranges)
        if (range.prefix.contains(address))
            return {range.kind, range.prefix, std::nullopt};
    return {AddressClass::global, whole_space(address), std::nullopt};
}

// Outside global unicast 2000::/3 everything not named above is unassigned (or deprecated,
// like site-local fec0::/10): reserved, its block the /3 it lies in.
AddressClassification outside_global_unicast(const IpAddress& address)
{
    in6_addr network{};
    network.s6_addr[0] = static_cast<uint8_t>(address.bytes()[0] & 0xe0);
    return {AddressClass::reserved, IpPrefix{IpAddress(network), 3}, std::nullopt};
}

} // namespace

std::optional<IpAddress> IpAddress::embedded_v4() const
{
    // :: and ::1 are IPv6's own, though they lie in the IPv4-compatible range.
    static const IpPrefix unspecified_and_loopback = prefix_of("::", 127);
    if (is_v4() || unspecified_and_loopback.contains(*this))
        return std::nullopt;
    for (const Embedding& embedding : embeddings()) {
        if (!embedding.prefix.contains(*this))
            continue;
        const auto b = bytes();
        return v4(b[embedding.offset], b[embedding.offset + 1], b[embedding.offset + 2], b[embedding.offset + 3]);
    }
    return std::nullopt;
}

bool IpPrefix::contains(const IpAddress& address) const
{
    return address.is_v4() == network.is_v4() && length <= address.bits() &&
           same_leading_bits(network.bytes(), address.bytes(), length);
}

bool IpPrefix::contains(const IpPrefix& other) const
{
    return other.length >= length && contains(other.network);
}

std::string IpPrefix::text() const
{
    if (length == network.bits())
        return network.text();
    return network.text() + "/" + std::to_string(length);
}

const char* address_class_name(AddressClass kind)
{
    switch (kind) {
    case AddressClass::global: return "public";
    case AddressClass::unspecified: return "unspecified";
    case AddressClass::loopback: return "loopback";
    case AddressClass::private_use: return "private";
    case AddressClass::link_local: return "link-local";
    case AddressClass::metadata: return "cloud metadata";
    case AddressClass::carrier_grade_nat: return "carrier-grade NAT";
    case AddressClass::multicast: return "multicast";
    case AddressClass::broadcast: return "broadcast";
    case AddressClass::reserved: return "reserved";
    case AddressClass::documentation: return "documentation";
    case AddressClass::benchmarking: return "benchmarking";
    }
    return "unknown";
}

AddressClassification classify_address(const IpAddress& address)
{
    if (address.is_v4())
        return classify_in(v4_ranges(), address);
    if (const auto v4 = address.embedded_v4()) {
        AddressClassification embedded = classify_in(v4_ranges(), *v4);
        embedded.embedded_v4 = v4;
        return embedded;
    }
    AddressClassification result = classify_in(v6_ranges(), address);
    static const IpPrefix global_unicast = prefix_of("2000::", 3);
    if (!result.special() && !global_unicast.contains(address))
        return outside_global_unicast(address);
    return result;
}

} // namespace agentvm
