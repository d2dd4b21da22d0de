// `agentvm template build | bake | list | inspect | rm`: templates, episode images baked from
// the user's own environment. The image is built and stored by templates/ (template_build.hpp,
// template_store.hpp); its snapshot is baked by an `agentvm snapshot bake` child, which is why
// this lives above vmm/ and not in templates/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agentvm {

// `template build`: each field named after its flag.
struct TemplateBuildSettings {
    std::string name;
    std::string from;
    std::string containerfile;
    std::string context;
    std::string packages;
    std::vector<std::string> copies;
    std::vector<std::string> env;
    std::string workdir;
    std::string user;
    std::vector<std::string> run;
    std::vector<std::string> warm_up;
    uint32_t cpus = 1;
    uint64_t mem_mib = 512;
    uint64_t disk_mib = 4096;
    std::string store;
    bool no_bake = false;
    double boot_timeout_s = 300;
};

// The other template commands: each uses the fields its flags fill.
struct TemplateSettings {
    std::string name;
    std::string store;
    bool json = false;
    double boot_timeout_s = 300;
};

// Each returns the exit status and throws Error naming what is wrong (a bad recipe, no such
// template, "default", which is set-up's own).
int build_template(const TemplateBuildSettings& settings);
int bake_template(const TemplateSettings& settings);
int list_templates(const TemplateSettings& settings);
int inspect_template(const TemplateSettings& settings);
int remove_template(const TemplateSettings& settings);

} // namespace agentvm
