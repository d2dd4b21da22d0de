// The order agentvm looks for its default guest in (episode/guest_location.hpp): the
// environment, then the checkout's build directory when the binary runs from one, then the
// installed guest; the file system is a set of paths the test decides.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "episode/guest_location.hpp"

using namespace agentvm;

namespace {

GuestSearch search(std::string env_dir, std::string binary_dir)
{
    return {std::move(env_dir), std::move(binary_dir), "/usr/lib/agentvm", "/var/lib/agentvm/snapshot"};
}

GuestLocation locate(const GuestSearch& search, std::set<std::string> files)
{
    return locate_guest(search, [&](const std::filesystem::path& path) { return files.contains(path.string()); });
}

} // namespace

TEST_CASE("the environment comes first, even over a checkout, and even when its directory is empty")
{
    const auto found = locate(search("/opt/guest", "/src/agentvm/build"), {"/src/agentvm/build/build.ninja"});
    CHECK(found.source == GuestSource::environment);
    CHECK(found.dir == "/opt/guest");
    CHECK(found.snapshot == "/opt/guest/snapshot");
}

TEST_CASE("a binary in a meson build directory takes that build's guest/")
{
    const auto found = locate(search("", "/src/agentvm/build"), {"/src/agentvm/build/build.ninja"});
    CHECK(found.source == GuestSource::checkout);
    CHECK(found.dir == "/src/agentvm/build/guest");
    CHECK(found.snapshot == "/src/agentvm/build/guest/snapshot");
}

TEST_CASE("a checkout's guest/ wins even before set-up has built it, over an installed guest")
{
    const auto found = locate(search("", "/src/agentvm/build"),
                              {"/src/agentvm/build/build.ninja", "/usr/lib/agentvm/vmlinux"});
    CHECK(found.source == GuestSource::checkout);
}

TEST_CASE("an installed binary takes the installed guest, its snapshot under the state directory")
{
    const auto found = locate(search("", "/usr/bin"), {"/usr/lib/agentvm/vmlinux"});
    CHECK(found.source == GuestSource::installed);
    CHECK(found.dir == "/usr/lib/agentvm");
    CHECK(found.snapshot == "/var/lib/agentvm/snapshot");
}

TEST_CASE("a copy of a build's binary elsewhere takes a guest/ beside it, and the installed guest without one")
{
    const auto copied = locate(search("", "/tmp/copy"), {"/tmp/copy/guest/vmlinux", "/usr/lib/agentvm/vmlinux"});
    CHECK(copied.source == GuestSource::checkout);
    CHECK(copied.dir == "/tmp/copy/guest");
    CHECK(copied.snapshot == "/tmp/copy/guest/snapshot");
    const auto alone = locate(search("", "/tmp/alone"), {"/usr/lib/agentvm/vmlinux"});
    CHECK(alone.source == GuestSource::installed);
}

TEST_CASE("each source has a name for messages")
{
    CHECK(std::string(describe(GuestSource::environment)) == "$AGENTVM_GUEST_DIR");
    CHECK(std::string(describe(GuestSource::checkout)) == "the checkout's build directory");
    CHECK(std::string(describe(GuestSource::installed)) == "the installed guest");
}
