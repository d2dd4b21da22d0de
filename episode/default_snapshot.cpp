#include "episode/default_snapshot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "episode/guest_location.hpp"

extern char** environ;

namespace agentvm {
namespace {

bool baked(const std::filesystem::path& snapshot)
{
    std::error_code ec;
    return std::filesystem::exists(snapshot / "manifest.json", ec);
}

// Runs `agentvm snapshot bake --default`, its output going to ours; whether it succeeded.
bool spawn_default_bake()
{
    std::vector<std::string> argv = {agentvm_binary(), "--log-level",
                                     std::string(spdlog::level::to_string_view(spdlog::get_level()).data()),
                                     "snapshot", "bake", "--default"};
    std::vector<char*> c_argv;
    for (std::string& arg : argv)
        c_argv.push_back(arg.data());
    c_argv.push_back(nullptr);
    pid_t pid = -1;
    if (const int err = ::posix_spawn(&pid, c_argv[0], nullptr, nullptr, c_argv.data(), environ); err != 0) {
        spdlog::warn("cannot start agentvm snapshot bake --default: {}", std::strerror(err));
        return false;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            throw_errno("waiting for agentvm snapshot bake --default");
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

} // namespace

std::string default_snapshot_out()
{
    const auto snapshot = default_guest().snapshot;
    std::error_code ec;
    std::filesystem::create_directories(snapshot.parent_path(), ec);
    if (ec)
        throw Error(fmt::format("cannot create '{}' for the default snapshot: {}", snapshot.parent_path().string(),
                                ec.message()));
    std::filesystem::remove_all(snapshot, ec);
    if (ec)
        throw Error(fmt::format("cannot remove the earlier default snapshot '{}': {}", snapshot.string(), ec.message()));
    return snapshot.string();
}

void bake_default_snapshot_on_first_use(const VmOptions& options)
{
    if (!options.uses_default_snapshot())
        return;
    const GuestLocation guest = default_guest();
    if (guest.source != GuestSource::installed || baked(guest.snapshot))
        return;
    const auto state_dir = guest.snapshot.parent_path();
    const auto lock_path = state_dir / ".bake.lock";
    std::error_code ec;
    std::filesystem::create_directories(state_dir, ec);  // a failure shows in the open below
    const Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!lock) {
        spdlog::warn("the default snapshot {} is not baked yet and cannot be baked here ({}: {}); "
                     "booting cold. As root: agentvm snapshot bake --default",
                     guest.snapshot.string(), lock_path.string(), std::strerror(errno));
        return;
    }
    int locked = 0;
    while ((locked = ::flock(lock.get(), LOCK_EX)) != 0 && errno == EINTR) {
    }
    // Some file systems (a network one) refuse locks; then two first uses at once may both bake.
    if (locked != 0)
        spdlog::warn("cannot lock '{}' ({}): baking without it", lock_path.string(), std::strerror(errno));
    if (baked(guest.snapshot))
        return;  // another command baked it while this one waited
    spdlog::info("baking the default snapshot into {} (once per host: a snapshot belongs to this host's CPU "
                 "and kernel; it takes one boot of the guest)",
                 guest.snapshot.string());
    const auto start = std::chrono::steady_clock::now();
    if (!spawn_default_bake()) {
        spdlog::warn("baking the default snapshot failed (above); booting cold. `agentvm snapshot bake --default` "
                     "tries again");
        return;
    }
    spdlog::info("default snapshot baked in {:.1f} s",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

} // namespace agentvm
