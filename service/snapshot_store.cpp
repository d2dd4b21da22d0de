#include "service/snapshot_store.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A paused sandbox's record is a few KiB; a bigger file is not one of ours.
constexpr std::uintmax_t max_record_bytes = 1 << 20;

void make_dir(const std::string& path)
{
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec || !fs::is_directory(path))
        throw Error(fmt::format("serve's state directory '{}' cannot be used: {}", path,
                                ec ? ec.message() : "not a directory"));
}

std::string read_small_file(const fs::path& path)
{
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec || size > max_record_bytes)
        throw Error(fmt::format("'{}': {}", path.string(), ec ? ec.message() : "too large"));
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

} // namespace

json PausedSandbox::to_json() const
{
    return {{"id", settings.id},
            {"snapshot", snapshot},
            {"pool", pool},
            {"timeout", settings.timeout.count()},
            {"idle_timeout", settings.idle_timeout ? json(settings.idle_timeout->count()) : json(nullptr)},
            {"env", settings.env},
            {"metadata", settings.metadata},
            {"paused_at", paused_at},
            {"retain_until", retain_until},
            {"disk_bytes", disk_bytes}};
}

PausedSandbox PausedSandbox::from_json(const json& j)
{
    try {
        PausedSandbox p;
        p.settings.id = j.at("id").get<std::string>();
        p.snapshot = j.at("snapshot").get<std::string>();
        p.pool = j.at("pool").get<std::string>();
        p.settings.timeout = std::chrono::seconds(j.at("timeout").get<int64_t>());
        if (!j.at("idle_timeout").is_null())
            p.settings.idle_timeout = std::chrono::seconds(j.at("idle_timeout").get<int64_t>());
        p.settings.env = j.at("env").get<std::map<std::string, std::string>>();
        p.settings.metadata = j.at("metadata");
        p.paused_at = j.at("paused_at").get<int64_t>();
        p.retain_until = j.at("retain_until").get<int64_t>();
        p.disk_bytes = j.at("disk_bytes").get<uint64_t>();
        if (p.settings.id.empty() || p.settings.id.find('/') != std::string::npos
            || !p.settings.metadata.is_object())
            throw Error("malformed id or metadata");
        return p;
    } catch (const json::exception& e) {
        throw Error(e.what());
    }
}

SnapshotStore::SnapshotStore(std::string state_dir)
    : paused_dir_(state_dir + "/paused"), snapshots_dir_(state_dir + "/snapshots"), outbox_dir_(state_dir + "/outbox")
{
    make_dir(state_dir);
    const std::string lock_path = state_dir + "/lock";
    lock_ = Fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!lock_)
        throw_errno(fmt::format("opening '{}'", lock_path));
    if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0)
        throw Error(fmt::format("serve's state directory '{}' is in use by another agentvm serve (--state-dir "
                                "names one per serve)",
                                state_dir));
    make_dir(paused_dir_);
    make_dir(snapshots_dir_);
    // Outboxes of VMs a killed serve left: nothing in them was taken, so nothing holds it.
    std::error_code ec;
    fs::remove_all(outbox_dir_, ec);
    if (ec)
        throw Error(fmt::format("serve's state directory: removing '{}': {}", outbox_dir_, ec.message()));
    make_dir(outbox_dir_);
    for (const auto& entry : fs::directory_iterator(paused_dir_)) {
        const fs::path path = entry.path();
        if (path.extension() != ".json") {
            fs::remove(path);  // a record that was being written when serve died
            continue;
        }
        try {
            PausedSandbox record = PausedSandbox::from_json(json::parse(read_small_file(path)));
            if (record.settings.id + ".json" != path.filename().string() || !owns(record.snapshot) ||
                !fs::exists(record.snapshot + "/manifest.json"))
                throw Error("it does not match its file name, or its snapshot is gone");
            const std::string id = record.settings.id;
            paused_[id] = std::move(record);
        } catch (const std::exception& e) {
            spdlog::error("paused sandbox record '{}' is unusable and is removed: {}", path.string(), e.what());
            fs::remove(path);
        }
    }
    // Holds from what is on disk: each snapshot on its parent, each record on its snapshot.
    for (const auto& entry : fs::directory_iterator(snapshots_dir_)) {
        const std::string path = entry.path().string();
        if (!owns(path) || !entry.is_directory() || entry.is_symlink()) {
            spdlog::warn("removing '{}' from serve's snapshots: not a snapshot serve made", path);
            fs::remove_all(path, ec);
            continue;
        }
        holds_.try_emplace(path, 0);
        if (const auto parent = parent_of(path))
            ++holds_[*parent];
    }
    for (const auto& [id, record] : paused_)
        paused_holds_.emplace(id, SnapshotHold(*this, record.snapshot));
    std::vector<std::string> unheld;
    for (const auto& [path, count] : holds_)
        if (count == 0)
            unheld.push_back(path);
    for (const std::string& path : unheld) {
        spdlog::info("removing snapshot '{}': nothing holds it any more", path);
        ++holds_[path];
        drop_hold(path);
    }
}

SnapshotStore::~SnapshotStore()
{
    for (auto& [id, hold] : paused_holds_)
        hold.store_ = nullptr;
}

bool SnapshotStore::owns(const std::string& path) const
{
    const fs::path p(path);
    return p.parent_path() == fs::path(snapshots_dir_) && valid_name(p.filename().string());
}

bool SnapshotStore::valid_name(std::string_view name)
{
    constexpr size_t max_name = 200;
    if (name.size() > max_name || !(name.starts_with("fork-") || name.starts_with("pause-")))
        return false;
    return std::all_of(name.begin(), name.end(),
                       [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

std::string SnapshotStore::new_name(std::string_view kind, std::string_view id)
{
    // Nanoseconds: unique across serve's restarts too, where a resumed sandbox keeps its id
    // and its earlier snapshots are still there.
    const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    std::string name = fmt::format("{}-{}-{}-{}", kind, id, now_ns, ++names_made_);
    if (!valid_name(name))
        throw Error(fmt::format("no snapshot name can be made for sandbox '{:.64}'", id));
    return name;
}

std::string SnapshotStore::new_outbox()
{
    std::string dir = outbox_dir_ + "/vm-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr)
        throw_errno(fmt::format("making a VM's snapshot outbox in '{}'", outbox_dir_));
    return dir;
}

void SnapshotStore::remove_outbox(const std::string& outbox)
{
    if (fs::path(outbox).parent_path() != fs::path(outbox_dir_))
        return;
    std::error_code ec;
    fs::remove_all(outbox, ec);
    if (ec)
        spdlog::error("removing a VM's snapshot outbox '{}': {}", outbox, ec.message());
}

SnapshotHold SnapshotStore::take_from_outbox(const std::string& outbox, const std::string& name,
                                             const std::string& path)
{
    const std::string written = outbox + "/" + name;
    if (!valid_name(name) || path != written)
        throw Error(fmt::format("the episode answered with snapshot '{:.256}', not the '{}' it was asked for", path,
                                written));
    struct stat st {};
    if (::lstat(written.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw Error(fmt::format("the episode's snapshot '{}' is not a directory", written));
    const std::string target = snapshots_dir_ + "/" + name;
    if (::rename(written.c_str(), target.c_str()) != 0)
        throw_errno(fmt::format("moving snapshot '{}' to '{}'", written, target));
    adopt(target);
    return SnapshotHold(*this, target);
}

SnapshotHold SnapshotStore::hold(const std::string& path)
{
    return SnapshotHold(*this, path);
}

std::optional<std::string> SnapshotStore::parent_of(const std::string& path) const
{
    try {
        const json manifest = json::parse(read_small_file(fs::path(path) / "manifest.json"));
        if (manifest.contains("parent")) {
            std::string parent = manifest.at("parent").at("dir").get<std::string>();
            if (owns(parent))
                return parent;
        }
    } catch (const std::exception& e) {
        spdlog::warn("snapshot '{}': cannot read its parent: {}", path, e.what());
    }
    return std::nullopt;
}

void SnapshotStore::adopt(const std::string& path)
{
    holds_.try_emplace(path, 0);
    if (const auto parent = parent_of(path))
        add_hold(*parent);
}

void SnapshotStore::add_hold(const std::string& path)
{
    if (owns(path))
        ++holds_[path];
}

void SnapshotStore::drop_hold(const std::string& path)
{
    auto it = holds_.find(path);
    if (it == holds_.end() || --it->second > 0)
        return;
    const std::optional<std::string> parent = parent_of(path);
    holds_.erase(it);
    if (!owns(path))
        return;  // never held: add_hold() and the start-up count take only our own
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec)
        spdlog::error("removing snapshot '{}': {}", path, ec.message());
    else
        spdlog::debug("snapshot '{}' removed: nothing holds it", path);
    if (parent)
        drop_hold(*parent);
}

void SnapshotStore::add_paused(PausedSandbox record, SnapshotHold snapshot)
{
    record.snapshot = snapshot.path();
    const std::string id = record.settings.id;
    const fs::path path = fs::path(paused_dir_) / (id + ".json");
    const fs::path partial = fs::path(paused_dir_) / (id + ".json.partial");
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        out << record.to_json().dump(2) << "\n";
        out.flush();
        if (!out)
            throw Error(fmt::format("writing the paused sandbox's record '{}'", partial.string()));
    }
    std::error_code ec;
    fs::rename(partial, path, ec);
    if (ec)
        throw Error(fmt::format("writing the paused sandbox's record '{}': {}", path.string(), ec.message()));
    paused_[id] = std::move(record);
    paused_holds_[id] = std::move(snapshot);
}

void SnapshotStore::remove_paused(std::string id)
{
    auto it = paused_.find(id);
    if (it == paused_.end())
        return;
    paused_.erase(it);
    std::error_code ec;
    fs::remove(fs::path(paused_dir_) / (id + ".json"), ec);
    paused_holds_.erase(id);
}

uint64_t SnapshotStore::stored_bytes(const std::string& path)
{
    uint64_t bytes = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
        struct stat st {};
        if (::stat(entry.path().c_str(), &st) == 0)
            bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    return bytes;
}

} // namespace agentvm
