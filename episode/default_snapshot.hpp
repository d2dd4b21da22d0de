// The installed default snapshot: made on this host, since a snapshot belongs to the CPU and
// kernel that made it and a package cannot ship one. `agentvm snapshot bake --default` bakes
// it; `run` and `episode` bake it on first use when it is missing.
#pragma once

#include <string>

#include "episode/vm_options.hpp"

namespace agentvm {

// `snapshot bake --default`: the directory to bake into (the default guest's snapshot
// directory, episode/guest_location.hpp), with any earlier snapshot there removed (a stale
// one would be refused anyway) and its parent created. Throws Error.
std::string default_snapshot_out();

// Before a run or an episode: when `options` restore the default snapshot of the installed
// guest and it is missing, bakes it in an `agentvm snapshot bake --default` child, saying so.
// A bake that cannot run or fails is a warning, not an error: the command then boots cold,
// which is only slower. Concurrent first uses take turns on a lock; the later ones find the
// snapshot baked.
void bake_default_snapshot_on_first_use(const VmOptions& options);

} // namespace agentvm
