#include "service/snapshot_store.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "service/vm_users/vm_dir_sharing.hpp"

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

// What a record keeps of a sandbox's settings, its id aside: what the user gave (not `warm`
// and `create_time`, which describe one hand-out).
void put_settings(json& j, const SandboxSettings& settings)
{
    j["timeout"] = settings.timeout.count();
    j["idle_timeout"] = settings.idle_timeout ? json(settings.idle_timeout->count()) : json(nullptr);
    j["env"] = settings.env;
    j["metadata"] = settings.metadata;
    j["pause_on_timeout"] = settings.pause_on_timeout;
    j["facade"] = settings.facade;
    if (settings.egress)
        j["egress"] = json{{"allow", settings.egress->allow}, {"deny", settings.egress->deny}};
}

// Throws json::exception or Error. pause_on_timeout, facade and egress are absent from the
// records of serves before them.
SandboxSettings get_settings(const json& j)
{
    SandboxSettings settings;
    settings.timeout = std::chrono::seconds(j.at("timeout").get<int64_t>());
    if (!j.at("idle_timeout").is_null())
        settings.idle_timeout = std::chrono::seconds(j.at("idle_timeout").get<int64_t>());
    settings.env = j.at("env").get<std::map<std::string, std::string>>();
    settings.metadata = j.at("metadata");
    settings.pause_on_timeout = j.value("pause_on_timeout", false);
    settings.facade = j.value("facade", json::object());
    if (j.contains("egress"))
        settings.egress = EgressRules{j.at("egress").at("allow").get<std::vector<std::string>>(),
                                      j.at("egress").at("deny").get<std::vector<std::string>>()};
    if (!settings.metadata.is_object() || !settings.facade.is_object())
        throw Error("malformed metadata or facade");
    return settings;
}

// Writes `record` as DIR/ID.json: a temporary file renamed, so that a crash leaves the old
// record or none, never half of one.
void write_record(const std::string& dir, const std::string& id, const json& record, const char* what)
{
    const fs::path path = fs::path(dir) / (id + ".json");
    const fs::path partial = fs::path(dir) / (id + ".json.partial");
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        out << record.dump(2) << "\n";
        out.flush();
        if (!out)
            throw Error(fmt::format("writing the {} record '{}'", what, partial.string()));
    }
    std::error_code ec;
    fs::rename(partial, path, ec);
    if (ec)
        throw Error(fmt::format("writing the {} record '{}': {}", what, path.string(), ec.message()));
}

} // namespace

json PausedSandbox::to_json() const
{
    json j{{"id", settings.id},
           {"snapshot", snapshot},
           {"pool", pool},
           {"paused_at", paused_at},
           {"retain_until", retain_until},
           {"disk_bytes", disk_bytes}};
    put_settings(j, settings);
    return j;
}

PausedSandbox PausedSandbox::from_json(const json& j)
{
    try {
        PausedSandbox p;
        p.settings = get_settings(j);
        p.settings.id = j.at("id").get<std::string>();
        p.snapshot = j.at("snapshot").get<std::string>();
        p.pool = j.at("pool").get<std::string>();
        p.paused_at = j.at("paused_at").get<int64_t>();
        p.retain_until = j.at("retain_until").get<int64_t>();
        p.disk_bytes = j.at("disk_bytes").get<uint64_t>();
        if (p.settings.id.empty() || p.settings.id.find('/') != std::string::npos)
            throw Error("malformed id");
        return p;
    } catch (const json::exception& e) {
        throw Error(e.what());
    }
}

json KeptSnapshot::to_json() const
{
    json j{{"id", id},
           {"names", names},
           {"sandbox_id", sandbox_id},
           {"snapshot", snapshot},
           {"pool", pool},
           {"created_at_ms", created_at_ms}};
    put_settings(j, settings);
    return j;
}

KeptSnapshot KeptSnapshot::from_json(const json& j)
{
    try {
        KeptSnapshot k;
        k.settings = get_settings(j);
        k.id = j.at("id").get<std::string>();
        k.names = j.at("names").get<std::vector<std::string>>();
        k.sandbox_id = j.at("sandbox_id").get<std::string>();
        k.snapshot = j.at("snapshot").get<std::string>();
        k.pool = j.at("pool").get<std::string>();
        k.created_at_ms = j.at("created_at_ms").get<int64_t>();
        if (!valid_id(k.id))
            throw Error("malformed id");
        return k;
    } catch (const json::exception& e) {
        throw Error(e.what());
    }
}

bool KeptSnapshot::valid_id(std::string_view id)
{
    constexpr std::string_view prefix = "snap-";
    return id.size() == prefix.size() + 16 && id.starts_with(prefix)
           && std::all_of(id.begin() + prefix.size(), id.end(),
                          [](char c) { return (c >= 'a' && c <= 'f') || (c >= '0' && c <= '9'); });
}

SnapshotStore::SnapshotStore(std::string state_dir)
    : paused_dir_(state_dir + "/paused"), kept_dir_(state_dir + "/kept"), snapshots_dir_(state_dir + "/snapshots"), outbox_dir_(state_dir + "/outbox")
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
    make_dir(kept_dir_);
    make_dir(snapshots_dir_);
    // Outboxes of VMs a killed serve left: nothing in them was taken, so nothing holds it.
    std::error_code ec;
    fs::remove_all(outbox_dir_, ec);
    if (ec)
        throw Error(fmt::format("serve's state directory: removing '{}': {}", outbox_dir_, ec.message()));
    make_dir(outbox_dir_);
    for_each_record(paused_dir_, "paused sandbox", [&](const fs::path& path, const json& doc) {
        PausedSandbox record = PausedSandbox::from_json(doc);
        if (record.settings.id + ".json" != path.filename().string() || !usable(record.snapshot))
            throw Error("it does not match its file name, or its snapshot is gone");
        const std::string id = record.settings.id;
        paused_[id] = std::move(record);
    });
    for_each_record(kept_dir_, "kept snapshot", [&](const fs::path& path, const json& doc) {
        KeptSnapshot record = KeptSnapshot::from_json(doc);
        if (record.id + ".json" != path.filename().string() || !usable(record.snapshot))
            throw Error("it does not match its file name, or its snapshot is gone");
        const std::string id = record.id;
        kept_[id] = std::move(record);
    });
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
    for (const auto& [id, record] : kept_)
        kept_holds_.emplace(id, SnapshotHold(*this, record.snapshot));
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
    for (auto& [id, hold] : kept_holds_)
        hold.store_ = nullptr;
}

bool SnapshotStore::usable(const std::string& snapshot) const
{
    return owns(snapshot) && fs::exists(snapshot + "/manifest.json");
}

void SnapshotStore::for_each_record(const std::string& dir, const char* what,
                                    const std::function<void(const fs::path&, const json&)>& take)
{
    for (const auto& entry : fs::directory_iterator(dir)) {
        const fs::path path = entry.path();
        if (path.extension() != ".json") {
            fs::remove(path);  // a record that was being written when serve died
            continue;
        }
        try {
            take(path, json::parse(read_small_file(path)));
        } catch (const std::exception& e) {
            spdlog::error("{} record '{}' is unusable and is removed: {}", what, path.string(), e.what());
            fs::remove(path);
        }
    }
}

bool SnapshotStore::owns(const std::string& path) const
{
    const fs::path p(path);
    return p.parent_path() == fs::path(snapshots_dir_) && valid_name(p.filename().string());
}

bool SnapshotStore::valid_name(std::string_view name)
{
    constexpr size_t max_name = 200;
    if (name.size() > max_name
        || !(name.starts_with("fork-") || name.starts_with("pause-") || name.starts_with("keep-")))
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
    try {
        reclaim_tree(outbox);  // what a VMM of its own uid left there
    } catch (const Error& e) {
        spdlog::error("removing a VM's snapshot outbox: {}", e.what());
    }
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
    // Written by a VMM that may run as its own uid: serve's before it is read or moved.
    reclaim_tree(written);
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
    write_record(paused_dir_, id, record.to_json(), "paused sandbox's");
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

void SnapshotStore::add_kept(KeptSnapshot record, SnapshotHold snapshot)
{
    record.snapshot = snapshot.path();
    const std::string id = record.id;
    if (!KeptSnapshot::valid_id(id))
        throw Error(fmt::format("'{:.64}' is not a kept snapshot's id", id));
    write_record(kept_dir_, id, record.to_json(), "kept snapshot's");
    kept_[id] = std::move(record);
    kept_holds_[id] = std::move(snapshot);
}

void SnapshotStore::remove_kept(std::string id)
{
    if (kept_.erase(id) == 0)
        return;
    std::error_code ec;
    fs::remove(fs::path(kept_dir_) / (id + ".json"), ec);
    kept_holds_.erase(id);
}

std::string SnapshotStore::new_kept_id() const
{
    for (;;) {
        unsigned char bytes[8];
        if (::getrandom(bytes, sizeof bytes, 0) != sizeof bytes)
            throw_errno("getrandom for a snapshot id");
        std::string id = "snap-";
        for (unsigned char b : bytes)
            id += fmt::format("{:02x}", b);
        if (!kept_.contains(id))
            return id;
    }
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
