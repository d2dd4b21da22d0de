#include "episode/supervised.hpp"

#include <optional>

#include "common/error.hpp"
#include "episode/default_snapshot.hpp"
#include "vmm/jail.hpp"
#include "vmm/supervisor.hpp"

namespace agentvm {
namespace {

// How long past its episode time limit a VMM may take to stop by itself before the supervisor
// kills it: the VMM's own deadline fails the pending calls and stops the VM in far less.
constexpr auto deadline_grace = std::chrono::seconds(30);

} // namespace

int run_supervised(VmOptions& options, int killed_code, const std::function<int()>& body)
{
    // Before the jail and the cgroup: the bake is a VMM of its own, with its own.
    bake_default_snapshot_on_first_use(options);
    if (!options.jailed())
        return body();
    check_jail_privileges(options.jail_identity().has_value());
    std::optional<VmCgroup> cgroup;
    if (options.wants_cgroup()) {
        cgroup.emplace(VmCgroup::create());
        options.attach_cgroup(&*cgroup);
    }
    Supervision supervision;
    supervision.cgroup = cgroup ? &*cgroup : nullptr;
    if (const auto timeout = options.episode_timeout())
        supervision.hard_deadline = *timeout + deadline_grace;
    supervision.killed_code = killed_code;
    return supervise(supervision, body);
}

} // namespace agentvm
