#include "episode/guest_location.hpp"

#include <cstdlib>

#include "agentvm_config.hpp"
#include "common/error.hpp"

namespace agentvm {

GuestLocation locate_guest(const GuestSearch& search,
                           const std::function<bool(const std::filesystem::path&)>& is_file)
{
    // An environment variable that is set wins even if its directory is empty: the user asked
    // for it, and the error about its missing files names it rather than falling through to a
    // guest the user did not mean.
    if (!search.env_dir.empty()) {
        const std::filesystem::path dir = search.env_dir;
        return {GuestSource::environment, dir, dir / "snapshot"};
    }
    // A build directory's binary takes that build's guest even before set-up has made it, so a
    // half-built checkout says what is missing there instead of running an installed guest that
    // another version of agentvm made. A binary with a guest/ of its own beside it (a build's
    // binary and guest copied together) takes that one.
    if (is_file(search.binary_dir / "build.ninja") || is_file(search.binary_dir / "guest" / "vmlinux")) {
        const auto dir = search.binary_dir / "guest";
        return {GuestSource::checkout, dir, dir / "snapshot"};
    }
    return {GuestSource::installed, search.installed_dir, search.installed_snapshot};
}

GuestSearch default_guest_search()
{
    GuestSearch search;
    if (const char* env = std::getenv("AGENTVM_GUEST_DIR"); env && *env)
        search.env_dir = env;
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec)
        throw Error("cannot locate the agentvm binary through /proc/self/exe: " + ec.message());
    search.binary_dir = exe.parent_path();
    search.installed_dir = AGENTVM_INSTALLED_GUEST_DIR;
    search.installed_snapshot = AGENTVM_INSTALLED_SNAPSHOT_DIR;
    return search;
}

GuestLocation default_guest()
{
    return locate_guest(default_guest_search(), [](const std::filesystem::path& path) {
        std::error_code ec;
        return std::filesystem::is_regular_file(path, ec);
    });
}

const char* describe(GuestSource source)
{
    switch (source) {
    case GuestSource::environment:
        return "$AGENTVM_GUEST_DIR";
    case GuestSource::checkout:
        return "the checkout's build directory";
    case GuestSource::installed:
        return "the installed guest";
    }
    return "";
}

} // namespace agentvm
