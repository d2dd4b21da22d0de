// The template store: one directory per template under a root (default
// /var/lib/agentvm/templates; AGENTVM_TEMPLATES or --store override it):
//   NAME/template.json   what the template is (format below) and the keys of what was built
//   NAME/rootfs.layer    its root filesystem's own blocks over its base (sparse)
//   NAME/rootfs.layer.ranges  which ranges of it those are (templates/image_delta.hpp)
//   NAME/snapshot/       its baked snapshot (agentvm snapshot bake), once baked
//   .bases/KEY.ext4      an unpacked source, shared by every template built from it (never
//                        written once made: templates boot from it)
//   .debs/               debootstrap's downloads, for --packages templates
//   .work/               builds in progress (removed when they end; a crashed one by the next)
//   .lock                held by a build, so two never write the store at once
// The name "default" is set-up's own guest (<agentvm dir>/guest/), never stored here.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd.hpp"

namespace agentvm {

inline constexpr char default_template_name[] = "default";
inline constexpr int template_format = 2;

// Now, as a manifest records when something was built or baked: 2026-12-02T10:07:31Z.
std::string utc_timestamp();

// Throws Error unless `name` is 1-63 of [a-z0-9._-], starting with a letter or digit: it
// becomes a directory name, so no path, no hidden file, no "..".
void check_template_name(const std::string& name);

class TemplateStore {
public:
    explicit TemplateStore(std::filesystem::path root);
    // --store if given, else AGENTVM_TEMPLATES, else /var/lib/agentvm/templates.
    static std::filesystem::path root_from(const std::string& given);

    const std::filesystem::path& root() const { return root_; }
    std::filesystem::path dir_of(const std::string& name) const { return root_ / name; }
    std::filesystem::path layer_of(const std::string& name) const { return dir_of(name) / "rootfs.layer"; }
    std::filesystem::path layer_ranges_of(const std::string& name) const { return dir_of(name) / "rootfs.layer.ranges"; }
    std::filesystem::path base_image(const std::string& base_key) const { return bases() / (base_key + ".ext4"); }
    std::filesystem::path snapshot_of(const std::string& name) const { return dir_of(name) / "snapshot"; }
    std::filesystem::path manifest_of(const std::string& name) const { return dir_of(name) / "template.json"; }
    std::filesystem::path bases() const { return root_ / ".bases"; }
    std::filesystem::path work() const { return root_ / ".work"; }
    std::filesystem::path debs() const { return root_ / ".debs"; }

    // The template's manifest; nullopt when there is no such template. Throws Error for one
    // that cannot be read or is not ours.
    std::optional<nlohmann::json> read(const std::string& name) const;
    // Replaces the manifest in one rename.
    void write(const std::string& name, const nlohmann::json& manifest) const;
    // Whether the template whose manifest this is has a baked snapshot on disk.
    bool baked(const std::string& name, const nlohmann::json& manifest) const;
    // Every stored template's manifest, by name.
    std::vector<nlohmann::json> list() const;
    // Removes the template. Throws Error when there is none of that name.
    void remove(const std::string& name) const;

    // Creates the store's directories and takes its lock (held until the Fd closes), then
    // removes what crashed builds left in .work/.
    Fd lock_for_build() const;

private:
    std::filesystem::path root_;
};

} // namespace agentvm
