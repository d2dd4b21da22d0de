#include "episode/template_options.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "common/error.hpp"
#include "templates/image_delta.hpp"
#include "templates/template_store.hpp"

namespace agentvm {

ResolvedTemplate resolve_template(const std::string& name, const std::string& store_flag)
{
    const TemplateStore store(TemplateStore::root_from(store_flag));
    const auto manifest = store.read(name);
    if (!manifest)
        throw Error(fmt::format("no template '{}' in '{}' (agentvm template list shows what there is)", name,
                                store.root().string()));
    ResolvedTemplate resolved;
    resolved.name = name;
    resolved.rootfs = store.base_image(manifest->value("base_key", "")).string();
    std::error_code ec;
    if (!std::filesystem::exists(resolved.rootfs, ec))
        throw Error(fmt::format("template '{}': its base image '{}' is missing (was .bases/ cleaned?): build the "
                                "template again",
                                name, resolved.rootfs));
    resolved.layer.path = store.layer_of(name).string();
    resolved.layer.byte_ranges =
        read_ranges_file(store.layer_ranges_of(name), manifest->value("disk_mib", uint64_t{0}) << 20);
    resolved.cpus = manifest->value("cpus", 1u);
    resolved.mem_mib = manifest->value("mem_mib", uint64_t{512});
    if (store.baked(name, *manifest))
        resolved.snapshot = store.snapshot_of(name).string();
    return resolved;
}

} // namespace agentvm
