// A snapshot manifest's sizes are range-checked before anything is sized by them: every bad
// vcpus, mem_mib or disk_bytes is refused with an error naming the field.
#include <doctest/doctest.h>

#include <string>

#include "common/error.hpp"
#include "vmm/snapshot_manifest.hpp"

using namespace agentvm;
using nlohmann::json;

namespace {

constexpr ManifestLimits limits{8, 4096, uint64_t{1} << 38};

json good()
{
    return {{"format", snapshot_format}, {"vcpus", 2}, {"mem_mib", 512}, {"disk_bytes", 700 << 20}};
}

SnapshotManifest decode(const json& manifest)
{
    const std::string text = manifest.dump();
    return decode_manifest(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), limits);
}

std::string refusal(const json& manifest)
{
    try {
        decode(manifest);
    } catch (const Error& e) {
        return e.what();
    }
    return "accepted";
}

json with(const char* field, const json& value)
{
    json m = good();
    m[field] = value;
    return m;
}

} // namespace

TEST_CASE("a manifest within the limits decodes")
{
    const SnapshotManifest m = decode(good());
    CHECK(m.vcpus == 2);
    CHECK(m.mem_mib == 512);
    CHECK(m.disk_bytes == uint64_t{700} << 20);
    json no_disk = good();
    no_disk.erase("disk_bytes");
    CHECK_FALSE(decode(no_disk).disk_bytes.has_value());
    CHECK(decode(with("vcpus", 8)).vcpus == 8);
    CHECK(decode(with("mem_mib", 4096)).mem_mib == 4096);
}

TEST_CASE("vcpus out of range is refused by name")
{
    // 2^32 + 2 would be 2 after a 32-bit conversion.
    for (const json& bad : {json(0), json(9), json(uint64_t{1} << 32 | 2), json(-1), json(1.5), json("2")})
        CHECK_MESSAGE(refusal(with("vcpus", bad)).find("manifest: vcpus " + bad.dump() + " is out of range: 1 to 8")
                          != std::string::npos,
                      bad.dump());
}

TEST_CASE("mem_mib out of range is refused by name, before any MiB-to-bytes product can wrap")
{
    // 2^44 + 1 MiB is 1 MiB once multiplied by 2^20 in 64 bits.
    for (const json& bad : {json(0), json(4097), json((uint64_t{1} << 44) + 1), json(-512), json(1e30)})
        CHECK_MESSAGE(refusal(with("mem_mib", bad)).find("manifest: mem_mib " + bad.dump() + " is out of range")
                          != std::string::npos,
                      bad.dump());
}

TEST_CASE("disk_bytes out of range or not whole sectors is refused by name")
{
    for (const json& bad : {json(0), json((uint64_t{1} << 38) + 512), json(-4096)})
        CHECK_MESSAGE(refusal(with("disk_bytes", bad)).find("manifest: disk_bytes " + bad.dump() + " is out of range")
                          != std::string::npos,
                      bad.dump());
    CHECK(refusal(with("disk_bytes", (700 << 20) + 1)).find("disk_bytes 734003201 is not a whole number of 512-byte")
          != std::string::npos);
}

TEST_CASE("another format, a missing field or no JSON at all is refused")
{
    CHECK(refusal(with("format", 99)).find("format 99; this agentvm reads format") != std::string::npos);
    json no_mem = good();
    no_mem.erase("mem_mib");
    CHECK(refusal(no_mem).find("malformed manifest") != std::string::npos);
    const std::string text = "{nope";
    CHECK_THROWS_WITH_AS(decode_manifest(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), limits),
                         doctest::Contains("malformed manifest"), Error);
}

TEST_CASE("a live snapshot's parent: an absolute dir, a SHA-256 and a depth within the limit")
{
    const std::string digest(64, 'a');
    const json parent = {{"dir", "/var/lib/agentvm/s1"}, {"manifest_digest", digest}, {"depth", 2}};
    const SnapshotManifest m = decode(with("parent", parent));
    REQUIRE(m.parent.has_value());
    CHECK(m.parent->dir == "/var/lib/agentvm/s1");
    CHECK(m.parent->manifest_digest == digest);
    CHECK(m.parent->depth == 2);
    CHECK_FALSE(decode(good()).parent.has_value());

    const auto refused = [&](const char* field, const json& value) {
        json p = parent;
        p[field] = value;
        return refusal(with("parent", p));
    };
    CHECK(refused("dir", "relative/s1").find("not an absolute path") != std::string::npos);
    CHECK(refused("dir", "").find("not an absolute path") != std::string::npos);
    CHECK(refused("manifest_digest", "abc").find("not a SHA-256") != std::string::npos);
    CHECK(refused("manifest_digest", std::string(64, 'G')).find("not a SHA-256") != std::string::npos);
    CHECK(refused("depth", 0).find("depth 0 is out of range") != std::string::npos);
    CHECK(refused("depth", max_snapshot_depth + 1).find("is out of range") != std::string::npos);
    CHECK(refused("dir", 7).find("malformed manifest") != std::string::npos);
    CHECK(refusal(with("parent", "s1")).find("malformed manifest") != std::string::npos);
}
