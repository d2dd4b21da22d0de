#include "templates/template_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

constexpr size_t max_name = 63;
constexpr size_t max_manifest_bytes = 1024 * 1024;

} // namespace

std::string utc_timestamp()
{
    const std::time_t now = std::time(nullptr);
    std::tm tm {};
    ::gmtime_r(&now, &tm);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return text;
}

void check_template_name(const std::string& name)
{
    const auto allowed = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    };
    const bool starts_well = !name.empty() && ((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= '0' && name[0] <= '9'));
    if (!starts_well || name.size() > max_name || !std::all_of(name.begin(), name.end(), allowed))
        throw Error(fmt::format("template name '{}': use 1-{} of a-z, 0-9, '.', '_', '-', starting with a letter or digit "
                                "(it names a directory: no paths)",
                                name, max_name));
}

TemplateStore::TemplateStore(std::filesystem::path root) : root_(std::move(root)) {}

std::filesystem::path TemplateStore::root_from(const std::string& given)
{
    if (!given.empty())
        return std::filesystem::absolute(given);
    if (const char* env = std::getenv("AGENTVM_TEMPLATES"); env && *env)
        return std::filesystem::absolute(env);
    return "/var/lib/agentvm/templates";
}

std::optional<nlohmann::json> TemplateStore::read(const std::string& name) const
{
    check_template_name(name);
    const auto path = manifest_of(name);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::error_code ec;
        if (!std::filesystem::exists(dir_of(name), ec))
            return std::nullopt;
        throw Error(fmt::format("template '{}' in '{}' has no readable template.json (a build that never finished? "
                                "agentvm template rm {})",
                                name, root_.string(), name));
    }
    std::string text(max_manifest_bytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    if (text.size() > max_manifest_bytes)
        throw Error(fmt::format("'{}' is larger than {} bytes: not a template manifest", path.string(), max_manifest_bytes));
    nlohmann::json manifest = nlohmann::json::parse(text, nullptr, false);
    if (manifest.is_object() && manifest.value("name", "") == name && manifest.contains("format") &&
        manifest["format"].is_number_integer() && manifest["format"] != template_format)
        throw Error(fmt::format("template '{}' was built by another agentvm (format {}, this one reads {}): build it "
                                "again (agentvm template build {} ...)",
                                name, manifest["format"].dump(), template_format, name));
    if (!manifest.is_object() || manifest.value("format", 0) != template_format || manifest.value("name", "") != name)
        throw Error(fmt::format("'{}' is not a template manifest of this agentvm (format {})", path.string(),
                                template_format));
    return manifest;
}

void TemplateStore::write(const std::string& name, const nlohmann::json& manifest) const
{
    const auto path = manifest_of(name);
    const auto tmp = path.string() + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << manifest.dump(2) << '\n';
        if (!out.flush())
            throw Error(fmt::format("writing '{}'", tmp));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec)
        throw Error(fmt::format("renaming '{}' into place: {}", tmp, ec.message()));
}

bool TemplateStore::baked(const std::string& name, const nlohmann::json& manifest) const
{
    std::error_code ec;
    return manifest.contains("snapshot") && !manifest["snapshot"].is_null()
           && std::filesystem::exists(snapshot_of(name) / "manifest.json", ec);
}

std::vector<nlohmann::json> TemplateStore::list() const
{
    std::vector<nlohmann::json> found;
    std::error_code ec;
    if (!std::filesystem::is_directory(root_, ec))
        return found;
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.empty() || name[0] == '.' || !entry.is_directory())
            continue;
        names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
        try {
            if (auto manifest = read(name))
                found.push_back(std::move(*manifest));
        } catch (const Error&) {
            found.push_back(nlohmann::json{{"name", name}, {"broken", true}});
        }
    }
    return found;
}

void TemplateStore::remove(const std::string& name) const
{
    check_template_name(name);
    std::error_code ec;
    if (!std::filesystem::exists(dir_of(name), ec))
        throw Error(fmt::format("no template '{}' in '{}'", name, root_.string()));
    std::filesystem::remove_all(dir_of(name), ec);
    if (ec)
        throw Error(fmt::format("removing template '{}': {}", name, ec.message()));
}

Fd TemplateStore::lock_for_build() const
{
    std::error_code ec;
    std::filesystem::create_directories(work(), ec);
    if (!ec)
        std::filesystem::create_directories(bases(), ec);
    if (ec)
        throw Error(fmt::format("creating the template store '{}': {}", root_.string(), ec.message()));
    Fd lock(::open((root_ / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!lock)
        throw_errno(fmt::format("opening '{}'", (root_ / ".lock").string()));
    if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK)
            throw_errno("locking the template store");
        spdlog::info("another build holds the template store '{}'; waiting for it", root_.string());
        if (::flock(lock.get(), LOCK_EX) != 0)
            throw_errno("locking the template store");
    }
    for (const auto& entry : std::filesystem::directory_iterator(work(), ec))
        std::filesystem::remove_all(entry.path(), ec);
    return lock;
}

} // namespace agentvm
