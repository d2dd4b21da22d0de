// What kind of destination an IP address is, for the egress policy (egress_policy.hpp): public,
// or one of the special-purpose ranges a sandbox must not reach unless a rule names them
// (IANA's IPv4 and IPv6 special-purpose address registries, RFC 6890 and its updates).
//
// An IPv6 address that carries an IPv4 one (IPv4-mapped ::ffff:a.b.c.d, SIIT ::ffff:0:a.b.c.d,
// IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::/96, 6to4 2002::/16) is classified by the IPv4 it
// carries, so that a DNS answer cannot bring 10.0.0.1 or 169.254.169.254 in as IPv6.
// Left out: Teredo (2001::/32) and the rest of 2001::/23 are classified reserved as a whole
// rather than decoded; the local-use NAT64 prefix 64:ff9b:1::/48 likewise.
//
// Pure: no DNS, no sockets; text goes through inet_pton/inet_ntop.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <netinet/in.h>
#include <sys/socket.h>

namespace agentvm {

// An IPv4 or IPv6 address, in network byte order.
class IpAddress {
public:
    IpAddress() = default;  // 0.0.0.0
    explicit IpAddress(const in_addr& address);
    explicit IpAddress(const in6_addr& address);
    static IpAddress v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d);

    // A dotted quad or IPv6 text as inet_pton takes it: no brackets, no zone (%eth0), no
    // inet_aton shorthand (127.1, 0x7f000001).
    static std::optional<IpAddress> parse(std::string_view text);
    // 4 bytes (IPv4) or 16 (IPv6), in network order; nullopt for any other length.
    static std::optional<IpAddress> from_bytes(std::span<const uint8_t> bytes);
    // An AF_INET or AF_INET6 socket address (what getaddrinfo answers); nullopt otherwise.
    static std::optional<IpAddress> from_sockaddr(const sockaddr* address, socklen_t length);

    bool is_v4() const { return size_ == 4; }
    size_t bits() const { return size_ * 8u; }
    std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
    std::string text() const;

    // The IPv4 address an IPv6 one carries (mapped, SIIT, compatible, NAT64, 6to4), if any.
    std::optional<IpAddress> embedded_v4() const;

    bool operator==(const IpAddress& other) const = default;

private:
    std::array<uint8_t, 16> bytes_{};
    uint8_t size_ = 4;
};

// An address range: `length` leading bits of `network`, the rest zero.
struct IpPrefix {
    IpAddress network;
    unsigned length = 0;

    // Same family and the same leading `length` bits.
    bool contains(const IpAddress& address) const;
    // `other` lies wholly inside this range.
    bool contains(const IpPrefix& other) const;
    // "10.0.0.0/8", or the bare address for a /32 or /128.
    std::string text() const;
};

enum class AddressClass {
    global,             // public: none of the below
    unspecified,        // 0.0.0.0/8, ::
    loopback,           // 127.0.0.0/8, ::1
    private_use,        // 10/8, 172.16/12, 192.168/16, fc00::/7
    link_local,         // 169.254/16, fe80::/10
    metadata,           // cloud instance metadata: 169.254.169.254, fd00:ec2::254, ...
    carrier_grade_nat,  // 100.64.0.0/10
    multicast,          // 224.0.0.0/4, ff00::/8
    broadcast,          // 255.255.255.255
    reserved,           // 240.0.0.0/4, 192.0.0.0/24, 2001::/23, IPv6 outside 2000::/3, ...
    documentation,      // 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20
    benchmarking,       // 198.18.0.0/15, 2001:2::/48
};

// "public", "private", "link-local", "cloud metadata", ...
const char* address_class_name(AddressClass kind);

struct AddressClassification {
    AddressClass kind = AddressClass::global;
    // The registry range that gave the class, in the family of the address classified (the
    // embedded IPv4 one when there is one). For a public address: the family's whole space.
    IpPrefix block;
    // Set when an IPv6 address was classified by the IPv4 address it carries.
    std::optional<IpAddress> embedded_v4;

    bool special() const { return kind != AddressClass::global; }
    // The address the class is about: the embedded IPv4 one, or the address itself.
    const IpAddress& subject(const IpAddress& address) const { return embedded_v4 ? *embedded_v4 : address; }
};

AddressClassification classify_address(const IpAddress& address);
inline AddressClassification classify_address(const in_addr& address) { return classify_address(IpAddress(address)); }
inline AddressClassification classify_address(const in6_addr& address) { return classify_address(IpAddress(address)); }

} // namespace agentvm
