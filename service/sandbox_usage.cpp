#include "service/sandbox_usage.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/whole_number.hpp"

namespace agentvm {
namespace {

namespace fs = std::filesystem;

// Bounds on what one reading walks: a VM is an episode, its supervisor and its VMM, with a
// few dozen open files.
constexpr size_t max_processes = 64;
constexpr size_t max_fds = 4096;
constexpr size_t max_small_file = 1 << 20;

std::string read_small(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    std::string text(max_small_file, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    return text;
}

// `root` and the processes under it, through each thread's children list.
std::vector<pid_t> process_tree(pid_t root)
{
    std::vector<pid_t> tree{root};
    for (size_t i = 0; i < tree.size() && tree.size() < max_processes; ++i) {
        std::error_code ec;
        for (const auto& task : fs::directory_iterator(fmt::format("/proc/{}/task", tree[i]), ec)) {
            std::istringstream children(read_small(task.path().string() + "/children"));
            for (pid_t child = 0; children >> child && tree.size() < max_processes;)
                if (std::find(tree.begin(), tree.end(), child) == tree.end())
                    tree.push_back(child);
        }
    }
    return tree;
}

// The bytes stored by an unnamed file of exactly `disk_bytes` that `pid` holds open: the
// disk's overlay, made O_TMPFILE or unlinked at once, so its link reads "... (deleted)".
std::optional<uint64_t> overlay_bytes(pid_t pid, uint64_t disk_bytes)
{
    const std::string fd_dir = fmt::format("/proc/{}/fd", pid);
    DIR* dir = ::opendir(fd_dir.c_str());
    if (!dir)
        return std::nullopt;  // not ours to read (another user's, or gone)
    std::optional<uint64_t> found;
    size_t seen = 0;
    while (const dirent* entry = ::readdir(dir)) {
        if (entry->d_name[0] == '.' || ++seen > max_fds)
            continue;
        const std::string link = fd_dir + "/" + entry->d_name;
        char target[512];
        const ssize_t length = ::readlink(link.c_str(), target, sizeof target);
        if (length <= 0 || !std::string_view(target, static_cast<size_t>(length)).ends_with(" (deleted)"))
            continue;
        struct stat st {};
        if (::stat(link.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == disk_bytes)
            found = std::max(found.value_or(0), static_cast<uint64_t>(st.st_blocks) * 512);
    }
    ::closedir(dir);
    return found;
}

} // namespace

std::optional<VmShape> vm_shape_of_manifest(std::string_view manifest)
{
    const nlohmann::json doc = nlohmann::json::parse(manifest, nullptr, false);
    if (!doc.is_object())
        return std::nullopt;
    const auto vcpus = doc.find("vcpus");
    const auto mem = doc.find("mem_mib");
    if (vcpus == doc.end() || mem == doc.end() || !vcpus->is_number_unsigned() || !mem->is_number_unsigned()
        || vcpus->get<uint64_t>() > 1024)
        return std::nullopt;
    VmShape shape;
    shape.vcpus = vcpus->get<unsigned>();
    shape.mem_mib = mem->get<uint64_t>();
    if (const auto disk = doc.find("disk_bytes"); disk != doc.end() && disk->is_number_unsigned())
        shape.disk_bytes = disk->get<uint64_t>();
    return shape;
}

std::optional<VmShape> pool_vm_shape(const PoolConfig& pool, const std::string& program)
{
    const std::vector<std::string>& args = pool.episode_args;
    const auto arg = [&](std::string_view flag) -> std::optional<std::string> {
        for (size_t i = 0; i + 1 < args.size(); ++i)
            if (args[i] == flag)
                return args[i + 1];
        return std::nullopt;
    };
    fs::path snapshot = fs::path(program).parent_path() / "guest" / "snapshot";
    if (const auto given = arg("--snapshot"))
        snapshot = *given;
    else if (const auto name = arg("--template"))
        snapshot = fs::path(arg("--template-store").value_or("")) / *name / "snapshot";
    std::error_code ec;
    if (!fs::is_regular_file(snapshot / "manifest.json", ec))
        return std::nullopt;
    return vm_shape_of_manifest(read_small((snapshot / "manifest.json").string()));
}

std::optional<double> cpu_seconds_of_stat(std::string_view stat, long ticks)
{
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so the fields are
    // counted from its last ')'; utime and stime are fields 14 and 15.
    const size_t close = stat.rfind(')');
    if (close == std::string_view::npos || ticks <= 0)
        return std::nullopt;
    std::istringstream fields{std::string(stat.substr(close + 1))};
    std::string field;
    std::optional<uint64_t> utime, stime;
    for (int number = 3; fields >> field && number <= 15; ++number) {
        if (number == 14)
            utime = whole_number<uint64_t>(field);
        else if (number == 15)
            stime = whole_number<uint64_t>(field);
    }
    if (!utime || !stime)
        return std::nullopt;
    return static_cast<double>(*utime + *stime) / static_cast<double>(ticks);
}

std::optional<uint64_t> rss_bytes_of_status(std::string_view status)
{
    constexpr std::string_view key = "VmRSS:";
    const size_t at = status.find(key);
    if (at == std::string_view::npos || (at > 0 && status[at - 1] != '\n'))
        return std::nullopt;
    std::istringstream line{std::string(status.substr(at + key.size(), 64))};
    std::string number, unit;
    line >> number >> unit;
    const std::optional<uint64_t> kib = whole_number<uint64_t>(number);
    if (!kib || unit != "kB" || *kib > (uint64_t{1} << 40))
        return std::nullopt;
    return *kib * 1024;
}

VmUsage measure_vm(pid_t episode, uint64_t disk_bytes)
{
    VmUsage usage;
    const long ticks = ::sysconf(_SC_CLK_TCK);
    for (pid_t pid : process_tree(episode)) {
        usage.cpu_seconds += cpu_seconds_of_stat(read_small(fmt::format("/proc/{}/stat", pid)), ticks).value_or(0);
        usage.rss_bytes += rss_bytes_of_status(read_small(fmt::format("/proc/{}/status", pid))).value_or(0);
        if (disk_bytes > 0)
            usage.disk_used = std::max(usage.disk_used, overlay_bytes(pid, disk_bytes).value_or(0));
    }
    return usage;
}

double CpuMeter::percent(const std::string& id, double cpu_seconds, unsigned vcpus, Clock::time_point started,
                         Clock::time_point now)
{
    // Readings of sandboxes nobody asked about for an hour (most have ended) are dropped.
    std::erase_if(last_, [&](const auto& entry) { return now - entry.second.at > std::chrono::hours(1); });
    Reading since{0, started};
    if (auto it = last_.find(id); it != last_.end() && it->second.cpu_seconds <= cpu_seconds)
        since = it->second;
    last_[id] = Reading{cpu_seconds, now};
    const double wall = std::chrono::duration<double>(now - since.at).count() * std::max(vcpus, 1u);
    if (wall <= 0)
        return 0;
    return std::clamp((cpu_seconds - since.cpu_seconds) / wall * 100, 0.0, 100.0);
}

} // namespace agentvm
