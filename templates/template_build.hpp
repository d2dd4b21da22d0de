// Building a template's root filesystem image from its source, on the host. Nothing of the
// image runs here: its files are unpacked and written, never executed (the --run steps and
// the warm-up run inside the template's own VM, when it is baked).
//
// The image is an ext4 file of --disk-size (sparse: unwritten blocks cost nothing), made by
// mkfs.ext4 and filled through a loop mount (nodev, nosuid, noexec) in a mount namespace of
// the build's own, so a build that dies leaves no mount behind. Filling a disk of the
// template's size is what bounds an image that unpacks to more than it should: it fails with
// "does not fit", on the build's own scratch file, never on the host's disk.
//
// Steps, each cached by the content of what it depends on:
//  1. the source, unpacked into a base image, kept in the store's .bases/ by the source's key
//     (its archive's digest, its layout's index, its directory's listing) and disk size;
//  2. the template's image: a copy of the base (a reflink where the filesystem can) with our
//     init and agent, the mount points init needs, --copy, and the image's Env/WorkingDir/User
//     with --env, --workdir and --user over them (/etc/agentvm/env, workdir and user,
//     protocol/image_defaults.hpp; the user resolved by templates/image_user.hpp). The store
//     keeps only the blocks this changed (templates/image_delta.hpp): the copy goes, and the
//     template boots as its base plus that layer.
// A template whose inputs are all unchanged is not rebuilt.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "templates/image_source.hpp"
#include "templates/template_store.hpp"

namespace agentvm {

struct TemplateRecipe {
    std::string name;
    TemplateSource source;
    std::vector<std::pair<std::filesystem::path, std::string>> copies;  // host path -> image path
    std::vector<std::string> env;                                       // KEY=VALUE, over the image's
    std::string workdir;                                                // over the image's WorkingDir
    std::string user;                                                   // over the image's User
    std::vector<std::string> run;                                       // in the guest, at bake
    std::vector<std::string> warm_up;                                   // in the guest, at bake
    uint32_t cpus = 1;
    uint64_t mem_mib = 512;
    uint64_t disk_mib = 4096;
};

// Parses --copy SRC:DST (DST absolute in the image; SRC a host path, which may not hold ':').
std::pair<std::filesystem::path, std::string> parse_copy(const std::string& spec);
// Checks --env KEY=VALUE.
void check_env_entry(const std::string& entry);

struct GuestBinaries {
    std::filesystem::path init;
    std::filesystem::path agent;
};

struct BuildResult {
    nlohmann::json manifest;
    bool image_rebuilt = false;
};

// Builds (or finds current) the template's image and writes its manifest to the store. The
// caller holds the store's lock (TemplateStore::lock_for_build). Throws Error; a failed build
// leaves the store as it was.
BuildResult build_template_image(const TemplateStore& store, const TemplateRecipe& recipe,
                                 const GuestBinaries& guest);

// Puts this process in a mount namespace of its own, whose mounts die with it. Throws Error.
void enter_private_mount_namespace();

} // namespace agentvm
