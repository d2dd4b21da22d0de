// --template NAME for the commands that start an agent VM (run, episode): the template's
// image, its baked snapshot when there is one, and its vCPUs and memory for a cold boot.
// "default" is set-up's own guest, as without --template.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "vmm/vm_config.hpp"

namespace agentvm {

struct ResolvedTemplate {
    std::string name;
    std::string rootfs;  // the base image its source unpacked to, shared with other templates
    DiskLayer layer;     // the template's own blocks over it
    std::optional<std::string> snapshot;  // none until `agentvm template bake`
    uint32_t cpus = 1;
    uint64_t mem_mib = 512;
};

// Reads template `name` from the store (--template-store, else AGENTVM_TEMPLATES, else the
// default). Throws Error naming the store when there is no such template, and naming what is
// missing when its base image or layer is.
ResolvedTemplate resolve_template(const std::string& name, const std::string& store_flag);

} // namespace agentvm
