#include "guest/image_defaults.hpp"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "guest/console.hpp"
#include "guest/read_file.hpp"

namespace agentvm {
namespace {

// The file's bytes; nullopt when it does not exist. Says why on the console for any other
// failure, or when the file is larger than max_image_defaults_bytes.
std::optional<std::string> read_defaults_file(const char* path)
{
    std::optional<std::string> text = read_small_file(path, max_image_defaults_bytes);
    if (!text && errno == EFBIG)
        say("ignoring %s: larger than %zu bytes", path, max_image_defaults_bytes);
    else if (!text && errno != ENOENT)
        say_errno(path);
    return text;
}

} // namespace

EnvEntries parse_image_env(std::string_view text)
{
    EnvEntries parsed;
    size_t begin = 0;
    while (begin < text.size()) {
        const size_t end = text.find('\0', begin);
        if (end == std::string_view::npos) {
            parsed.rejected.push_back("the last entry has no ending NUL (a cut file)");
            break;
        }
        const std::string_view entry = text.substr(begin, end - begin);
        begin = end + 1;
        const size_t equals = entry.find('=');
        if (equals == std::string_view::npos || equals == 0) {
            parsed.rejected.push_back("an entry without KEY=: " + std::string(entry.substr(0, 64)));
            continue;
        }
        parsed.entries.emplace_back(std::string(entry.substr(0, equals)), std::string(entry.substr(equals + 1)));
    }
    return parsed;
}

std::string parse_image_workdir(std::string_view text)
{
    if (!text.empty() && text.back() == '\n')
        text.remove_suffix(1);
    if (text.empty() || text.front() != '/' || text.find('\0') != std::string_view::npos
        || text.find('\n') != std::string_view::npos)
        return "";
    return std::string(text);
}

std::string apply_image_defaults()
{
    if (const std::optional<std::string> env = read_defaults_file(image_env_path)) {
        const EnvEntries parsed = parse_image_env(*env);
        for (const auto& [key, value] : parsed.entries)
            if (::setenv(key.c_str(), value.c_str(), 1) != 0)
                say_errno(("setenv " + key).c_str());
        for (const std::string& why : parsed.rejected)
            say("%s: skipped %s", image_env_path, why.c_str());
    }
    const std::optional<std::string> workdir_text = read_defaults_file(image_workdir_path);
    if (!workdir_text)
        return "";
    std::string workdir = parse_image_workdir(*workdir_text);
    if (workdir.empty())
        say("ignoring %s: not an absolute path", image_workdir_path);
    return workdir;
}

} // namespace agentvm
