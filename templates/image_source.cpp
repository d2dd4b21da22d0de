#include "templates/image_source.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "templates/tool.hpp"

namespace agentvm {
namespace {

constexpr char layout_tag[] = "image";
// The default guest's (rootfs/build.sh): a packages template is that guest plus the packages.
constexpr char debian_suite[] = "bookworm";
constexpr char base_packages[] = "python3,procps";

std::string layout_ref(const std::filesystem::path& layout)
{
    return "oci:" + layout.string() + ":" + layout_tag;
}

void require_exists(const std::filesystem::path& path, bool directory, const std::string& what)
{
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw_errno(fmt::format("{} '{}'", what, path.string()));
    if (directory && !S_ISDIR(st.st_mode))
        throw Error(fmt::format("{} '{}' is not a directory", what, path.string()));
    if (!directory && !S_ISREG(st.st_mode))
        throw Error(fmt::format("{} '{}' is not a file", what, path.string()));
}

std::vector<std::string> string_list(const nlohmann::json& value, const char* field)
{
    std::vector<std::string> list;
    if (value.is_null())
        return list;
    if (!value.is_array())
        throw Error(fmt::format("the image config's {} is not a list", field));
    for (const auto& item : value) {
        if (!item.is_string())
            throw Error(fmt::format("the image config's {} holds a non-string", field));
        list.push_back(item.get<std::string>());
    }
    return list;
}

std::string string_field(const nlohmann::json& object, const char* field)
{
    const auto found = object.find(field);
    if (found == object.end() || found->is_null())
        return "";
    if (!found->is_string())
        throw Error(fmt::format("the image config's {} is not a string", field));
    return found->get<std::string>();
}

} // namespace

std::string TemplateSource::text() const
{
    switch (kind) {
    case SourceKind::oci_archive:
        return "oci-archive:" + path.string();
    case SourceKind::docker_archive:
        return "docker-archive:" + path.string();
    case SourceKind::oci_layout:
        return "oci:" + path.string() + (tag.empty() ? "" : ":" + tag);
    case SourceKind::dir:
        return "dir:" + path.string();
    case SourceKind::containerfile:
        return "containerfile:" + path.string() + " (context " + context.string() + ")";
    case SourceKind::packages: {
        std::string list;
        for (const std::string& package : packages)
            list += (list.empty() ? "" : ",") + package;
        return "packages:" + list;
    }
    }
    return "";
}

TemplateSource parse_from(const std::string& from)
{
    const size_t colon = from.find(':');
    if (colon == std::string::npos || colon + 1 == from.size())
        throw Error(fmt::format("--from '{}': expected oci-archive:PATH, docker-archive:PATH, oci:DIR[:TAG] or dir:PATH",
                                from));
    const std::string transport = from.substr(0, colon);
    std::string rest = from.substr(colon + 1);
    TemplateSource source;
    if (transport == "oci-archive") {
        source.kind = SourceKind::oci_archive;
    } else if (transport == "docker-archive") {
        source.kind = SourceKind::docker_archive;
    } else if (transport == "oci") {
        source.kind = SourceKind::oci_layout;
        // DIR:TAG, unless DIR itself holds the colon (an existing directory of that name).
        const size_t tag_colon = rest.rfind(':');
        struct stat st {};
        if (tag_colon != std::string::npos && ::stat(rest.c_str(), &st) != 0) {
            source.tag = rest.substr(tag_colon + 1);
            rest = rest.substr(0, tag_colon);
        }
    } else if (transport == "dir") {
        source.kind = SourceKind::dir;
    } else {
        throw Error(fmt::format("--from '{}': unknown source '{}:' (oci-archive:, docker-archive:, oci:, dir:)", from,
                                transport));
    }
    source.path = std::filesystem::absolute(rest);
    const bool directory = source.kind == SourceKind::oci_layout || source.kind == SourceKind::dir;
    require_exists(source.path, directory, "--from " + transport + ":");
    return source;
}

TemplateSource containerfile_source(const std::filesystem::path& file, const std::filesystem::path& context)
{
    TemplateSource source;
    source.kind = SourceKind::containerfile;
    source.path = std::filesystem::absolute(file);
    source.context = std::filesystem::absolute(context.empty() ? source.path.parent_path() : context);
    require_exists(source.path, false, "--containerfile");
    require_exists(source.context, true, "--context");
    return source;
}

TemplateSource packages_source(const std::string& list, const std::string& mirror)
{
    TemplateSource source;
    source.kind = SourceKind::packages;
    source.mirror = mirror;
    size_t begin = 0;
    while (begin <= list.size()) {
        const size_t comma = std::min(list.find(',', begin), list.size());
        const std::string name = list.substr(begin, comma - begin);
        begin = comma + 1;
        // Debian policy 5.6.1: lower case letters, digits, + - . ; at least two, a letter or
        // digit first. Anything else would reach debootstrap's command line.
        const bool valid = name.size() >= 2 && std::isalnum(static_cast<unsigned char>(name[0]))
                           && std::all_of(name.begin(), name.end(), [](char c) {
                                  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
                              });
        if (!valid)
            throw Error(fmt::format("--packages '{}': '{}' is not a Debian package name", list, name));
        source.packages.push_back(name);
    }
    return source;
}

void debootstrap_tree(const TemplateSource& source, const std::filesystem::path& tree, const std::filesystem::path& debs)
{
    std::filesystem::create_directories(debs);
    run_tool({"debootstrap", "--variant=minbase", fmt::format("--include={},{}", base_packages, fmt::join(source.packages, ",")),
              "--components=main", "--cache-dir=" + debs.string(), debian_suite, tree.string(), source.mirror},
             {.what = fmt::format("installing Debian {} with {} from {} (debootstrap)", debian_suite,
                                  fmt::join(source.packages, ","), source.mirror)});
}

std::vector<std::pair<std::string, std::string>> tools_for(const TemplateSource& source)
{
    switch (source.kind) {
    case SourceKind::dir:
        return {};
    case SourceKind::packages:
        return {{"debootstrap", "debootstrap"}};
    case SourceKind::containerfile:
        return {{"buildah", "buildah"}, {"skopeo", "skopeo"}, {"umoci", "umoci"}};
    default:
        return {{"skopeo", "skopeo"}, {"umoci", "umoci"}};
    }
}

ImageConfig parse_image_config(const std::string& json)
{
    const nlohmann::json doc = nlohmann::json::parse(json, nullptr, false);
    if (!doc.is_object())
        throw Error("the image config is not a JSON object");
    ImageConfig config;
    config.architecture = string_field(doc, "architecture");
    const auto process = doc.find("config");
    if (process != doc.end() && !process->is_null()) {
        if (!process->is_object())
            throw Error("the image config's config is not an object");
        config.env = string_list(process->value("Env", nlohmann::json()), "Env");
        config.workdir = string_field(*process, "WorkingDir");
        config.user = string_field(*process, "User");
    }
    return config;
}

void import_image(const TemplateSource& source, const std::filesystem::path& layout, const std::string& name)
{
    std::string from;
    switch (source.kind) {
    case SourceKind::oci_archive:
        from = "oci-archive:" + source.path.string();
        break;
    case SourceKind::docker_archive:
        from = "docker-archive:" + source.path.string();
        break;
    case SourceKind::oci_layout:
        from = "oci:" + source.path.string() + (source.tag.empty() ? "" : ":" + source.tag);
        break;
    case SourceKind::containerfile: {
        // Built in buildah's own store under a name of ours, then copied out and untagged:
        // the layers stay cached there for the next build of the same steps.
        const std::string image = "localhost/agentvm-template-" + name;
        run_tool({"buildah", "build", "--quiet", "--isolation", "chroot", "--layers", "--pull=never", "-f",
                  source.path.string(), "-t", image, source.context.string()},
                 {.what = "building the Containerfile (buildah)", .show_stderr = true});
        run_tool({"buildah", "push", "--quiet", image, layout_ref(layout)},
                 {.what = "exporting the built image (buildah push)"});
        return;
    }
    case SourceKind::dir:
    case SourceKind::packages:
        throw Error(source.text() + " is not an image");
    }
    run_tool({"skopeo", "copy", "--quiet", from, layout_ref(layout)},
             {.what = fmt::format("reading the image {} (skopeo copy)", from)});
}

ImageConfig read_image_config(const std::filesystem::path& layout)
{
    return parse_image_config(run_tool({"skopeo", "inspect", "--config", layout_ref(layout)},
                                       {.what = "reading the image's config (skopeo inspect)"}));
}

std::string image_digest(const std::filesystem::path& layout)
{
    const std::string digest = run_tool({"skopeo", "inspect", "--format", "{{.Digest}}", layout_ref(layout)},
                                        {.what = "reading the image's digest (skopeo inspect)"});
    const size_t end = digest.find_first_of(" \n");
    return digest.substr(0, end);
}

void unpack_image(const std::filesystem::path& layout, const std::filesystem::path& target)
{
    run_tool({"umoci", "--log", "error", "raw", "unpack", "--image", layout.string() + ":" + layout_tag, target.string()},
             {.what = "unpacking the image's layers (umoci)"});
}

} // namespace agentvm
