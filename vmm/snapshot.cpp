#include "vmm/snapshot.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agentvm_config.hpp"
#include "devices/state_json.hpp"
#include "common/error.hpp"
#include "common/file_digest.hpp"
#include "core/layout.hpp"
#include "vmm/vm_limits.hpp"

namespace agentvm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* manifest_name = "manifest.json";
constexpr const char* state_name = "state.cbor";
constexpr const char* memory_name = "memory";
constexpr const char* disk_name = "disk";
// Generous for any VM's state document; bounds what a corrupted file can make us read.
constexpr uint64_t max_state_bytes = uint64_t{64} << 20;
constexpr uint64_t max_manifest_bytes = uint64_t{1} << 20;

// CPUID words whose feature bits a restored vCPU may be using: (leaf, subleaf, register).
struct FeatureWord {
    uint32_t leaf;
    uint32_t index;
    const char* reg;
};
constexpr FeatureWord feature_words[] = {
    {1, 0, "ecx"}, {1, 0, "edx"}, {7, 0, "ebx"}, {7, 0, "ecx"}, {7, 0, "edx"},
    {0xd, 1, "eax"}, {0x80000001, 0, "ecx"}, {0x80000001, 0, "edx"},
};

uint32_t reg_of(const kvm_cpuid_entry2& e, const std::string& reg)
{
    return reg == "eax" ? e.eax : reg == "ebx" ? e.ebx : reg == "ecx" ? e.ecx : e.edx;
}

std::string feature_key(const FeatureWord& w)
{
    return fmt::format("{:#x}.{}.{}", w.leaf, w.index, w.reg);
}

// What KVM offers on this host, the words agentvm's vCPUs take their features from.
json host_cpu(const Kvm& kvm)
{
    const auto entries = kvm.supported_cpuid();
    std::string vendor;
    json features = json::object();
    for (const auto& e : entries) {
        if (e.function == 0) {
            const uint32_t words[] = {e.ebx, e.edx, e.ecx};
            vendor.assign(reinterpret_cast<const char*>(words), sizeof words);
        }
        for (const auto& w : feature_words)
            if (e.function == w.leaf && e.index == w.index)
                features[feature_key(w)] = reg_of(e, w.reg);
    }
    return {{"vendor", vendor}, {"features", features}};
}

json stamp_json(const FileStamp& s)
{
    return {{"dev", s.dev}, {"ino", s.ino}, {"size", s.size}, {"mtime_ns", s.mtime_ns}, {"ctime_ns", s.ctime_ns}};
}

FileStamp stamp_from(const json& j)
{
    return {j.at("dev").get<uint64_t>(), j.at("ino").get<uint64_t>(), j.at("size").get<uint64_t>(),
            j.at("mtime_ns").get<int64_t>(), j.at("ctime_ns").get<int64_t>()};
}

Fd open_read(const std::string& path, const std::string& what)
{
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
        throw_errno(fmt::format("{} '{}'", what, path));
    return fd;
}

// An input file as the manifest records it: where it was, its stamp and its content digest.
json input_file(const std::string& path, const std::string& what)
{
    Fd fd = open_read(path, what);
    return {{"path", fs::absolute(path).string()},
            {"stamp", stamp_json(file_stamp(fd.get(), path))},
            {"digest", content_digest(fd.get(), path)}};
}

void write_all(int fd, const void* data, size_t len, const std::string& what)
{
    const auto* p = static_cast<const uint8_t*>(data);
    while (len > 0) {
        const ssize_t n = ::write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw_errno(fmt::format("writing {}", what));
        p += n;
        len -= static_cast<size_t>(n);
    }
}

Fd create_file(const fs::path& path)
{
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd)
        throw_errno(fmt::format("creating '{}'", path.string()));
    return fd;
}

// A written file's record: size, digest and the stamp it has once synced.
json stored_file(int fd, const fs::path& path)
{
    if (::fsync(fd) != 0)
        throw_errno(fmt::format("fsync '{}'", path.string()));
    return {{"digest", content_digest(fd, path.string())}, {"stamp", stamp_json(file_stamp(fd, path.string()))}};
}

std::vector<uint8_t> read_file_bytes(int fd, uint64_t limit, const std::string& name)
{
    const FileStamp stamp = file_stamp(fd, name);
    if (stamp.size > limit)
        throw Error(fmt::format("snapshot: '{}' is {} bytes, more than a snapshot's {} could be", name,
                                stamp.size, limit));
    std::vector<uint8_t> bytes(stamp.size);
    size_t got = 0;
    while (got < bytes.size()) {
        const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw_errno(fmt::format("reading '{}'", name), n == 0 ? EIO : errno);
        got += static_cast<size_t>(n);
    }
    return bytes;
}

class PartialDir {
public:
    explicit PartialDir(const fs::path& target)
    {
        std::random_device random;
        path_ = target;
        path_ += fmt::format(".partial-{:08x}", random());
        if (::mkdir(path_.c_str(), 0755) != 0)
            throw_errno(fmt::format("creating '{}'", path_.string()));
    }
    ~PartialDir()
    {
        if (!path_.empty()) {
            std::error_code ec;
            fs::remove_all(path_, ec);
        }
    }
    const fs::path& path() const { return path_; }
    void commit(const fs::path& target)
    {
        if (::rename(path_.c_str(), target.c_str()) != 0)
            throw_errno(fmt::format("renaming the snapshot into '{}'", target.string()));
        path_.clear();
    }

private:
    fs::path path_;
};

} // namespace

SnapshotWriter::SnapshotWriter(const Kvm& kvm, const VmConfig& config, const std::string& dir)
    : target_(fs::absolute(dir)), dir_(dir)
{
    if (fs::exists(target_))
        throw Error(fmt::format("snapshot directory '{}' already exists; remove it or choose another --out", dir));
    if (!fs::is_directory(target_.parent_path()))
        throw Error(fmt::format("cannot create snapshot directory '{}': '{}' is not a directory", dir,
                                target_.parent_path().string()));
    json& manifest = manifest_;
    manifest["format"] = snapshot_format;
    manifest["agentvm_version"] = AGENTVM_VERSION;
    manifest["vcpus"] = config.vcpus;
    manifest["mem_mib"] = config.mem_mib;
    manifest["kernel"] = input_file(config.kernel_path, "kernel");
    if (config.rootfs_path)
        manifest["rootfs"] = input_file(*config.rootfs_path, "root filesystem");
    manifest["host_cpu"] = host_cpu(kvm);
}

SnapshotSummary SnapshotWriter::write(const Vm& vm) const
{
    if (fs::exists(target_))
        throw Error(fmt::format("snapshot directory '{}' already exists; remove it or choose another --out", dir_));
    PartialDir partial(target_);
    SnapshotSummary summary;
    summary.dir = target_.string();
    json manifest = manifest_;
    if (vm.disk_bytes() > max_snapshot_disk_sectors * CowDisk::sector_size)
        throw Error(fmt::format("a disk of {} GiB cannot be snapshotted: at most {} GiB", vm.disk_bytes() >> 30,
                                (max_snapshot_disk_sectors * CowDisk::sector_size) >> 30));
    if (vm.disk_bytes() != 0)
        manifest["disk_bytes"] = vm.disk_bytes();

    const std::vector<uint8_t> state = encode_cbor(vm.save_state());
    Fd state_fd = create_file(partial.path() / state_name);
    write_all(state_fd.get(), state.data(), state.size(), state_name);
    summary.state_bytes = state.size();
    manifest["files"][state_name] = stored_file(state_fd.get(), partial.path() / state_name);

    Fd memory_fd = create_file(partial.path() / memory_name);
    vm.save_memory(memory_fd.get());
    manifest["files"][memory_name] = stored_file(memory_fd.get(), partial.path() / memory_name);
    struct stat st {};
    if (::fstat(memory_fd.get(), &st) == 0)
        summary.memory_data_bytes = static_cast<uint64_t>(st.st_blocks) * 512;

    Fd disk_fd = create_file(partial.path() / disk_name);
    vm.save_disk(disk_fd.get());
    manifest["files"][disk_name] = stored_file(disk_fd.get(), partial.path() / disk_name);
    if (::fstat(disk_fd.get(), &st) == 0)
        summary.disk_data_bytes = static_cast<uint64_t>(st.st_blocks) * 512;

    const std::string text = manifest.dump(2) + "\n";
    Fd manifest_fd = create_file(partial.path() / manifest_name);
    write_all(manifest_fd.get(), text.data(), text.size(), manifest_name);
    if (::fsync(manifest_fd.get()) != 0)
        throw_errno("fsync manifest.json");
    partial.commit(target_);
    return summary;
}

namespace {

// A snapshot's own file, opened: its size must be the recorded one.
Fd open_stored(const fs::path& path, const json& record)
{
    Fd fd = open_read(path.string(), "snapshot file");
    const uint64_t size = file_stamp(fd.get(), path.string()).size;
    const uint64_t recorded = stamp_from(record.at("stamp")).size;
    if (size != recorded)
        throw Error(fmt::format("snapshot file '{}' is {} bytes, the manifest says {}: truncated or replaced",
                                path.string(), size, recorded));
    return fd;
}

void check_digest(const std::string& digest, const fs::path& path, const json& record)
{
    if (digest != record.at("digest").get<std::string>())
        throw Error(fmt::format("snapshot file '{}' is corrupted: its content does not match the manifest's digest",
                                path.string()));
}

// state.cbor: read once, and the bytes whose digest is checked are the bytes decoded.
json read_state(const fs::path& dir, const json& record)
{
    const fs::path path = dir / state_name;
    Fd fd = open_stored(path, record);
    const std::vector<uint8_t> bytes = read_file_bytes(fd.get(), max_state_bytes, state_name);
    check_digest(content_digest(bytes), path, record);
    return decode_cbor(bytes);
}

// memory and disk: hashed only when their stamp says they were copied or written since the bake
// (see snapshot.hpp for what that trusts).
Fd open_large(const fs::path& dir, const char* name, const json& record)
{
    const fs::path path = dir / name;
    Fd fd = open_stored(path, record);
    if (file_stamp(fd.get(), path.string()) != stamp_from(record.at("stamp"))) {
        spdlog::info("snapshot file '{}' changed since the bake; checking its digest", path.string());
        check_digest(content_digest(fd.get(), path.string()), path, record);
    }
    return fd;
}

void check_input(const json& record, const std::string& path, const std::string& what)
{
    Fd fd = open_read(path, what);
    if (file_stamp(fd.get(), path) == stamp_from(record.at("stamp")))
        return;
    if (content_digest(fd.get(), path) != record.at("digest").get<std::string>())
        throw Error(fmt::format("the snapshot was baked with another {} ('{}') than '{}': rebake it, or "
                                "pass the {} it was baked with",
                                what, record.at("path").get<std::string>(), path, what));
}

void check_host_cpu(const Kvm& kvm, const json& recorded)
{
    const json here = host_cpu(kvm);
    if (here.at("vendor") != recorded.at("vendor"))
        throw Error(fmt::format("the snapshot was baked on a {} CPU; this host's is {}",
                                recorded.at("vendor").get<std::string>(), here.at("vendor").get<std::string>()));
    for (const auto& [key, value] : recorded.at("features").items()) {
        const uint32_t wanted = value.get<uint32_t>();
        const uint32_t have = here.at("features").value(key, 0u);
        if (wanted & ~have)
            throw Error(fmt::format("this host's CPU (as KVM offers it) lacks features the snapshot's vCPUs "
                                    "were given: CPUID {} bits {:#x}",
                                    key, wanted & ~have));
    }
}

} // namespace

LoadedSnapshot load_snapshot(const Kvm& kvm, const std::string& dir, VmConfig config)
{
    const fs::path root(dir);
    Fd manifest_fd = open_read((root / manifest_name).string(), "snapshot manifest");
    const auto manifest_bytes = read_file_bytes(manifest_fd.get(), max_manifest_bytes, manifest_name);
    const ManifestLimits limits{vcpu_limit(kvm), host_ram_mib(), max_snapshot_disk_sectors * CowDisk::sector_size};
    SnapshotManifest decoded;
    try {
        decoded = decode_manifest(manifest_bytes, limits);
    } catch (const Error& e) {
        throw Error(fmt::format("snapshot '{}': {}", dir, e.what()));
    }
    LoadedSnapshot loaded;
    try {
        const json& manifest = decoded.doc;
        if (config.vcpus != 0 && config.vcpus != decoded.vcpus)
            throw Error(fmt::format("--cpus {}: the snapshot was baked with {} vCPUs", config.vcpus, decoded.vcpus));
        if (config.mem_mib != 0 && config.mem_mib != decoded.mem_mib)
            throw Error(fmt::format("--mem {}: the snapshot was baked with {} MiB", config.mem_mib, decoded.mem_mib));
        config.vcpus = decoded.vcpus;
        config.mem_mib = decoded.mem_mib;
        check_input(manifest.at("kernel"), config.kernel_path, "kernel");
        if (manifest.contains("rootfs") != config.rootfs_path.has_value())
            throw Error("the snapshot and this VM disagree on having a root disk");
        if (config.rootfs_path) {
            check_input(manifest.at("rootfs"), *config.rootfs_path, "root filesystem");
            if (!decoded.disk_bytes)
                throw Error(fmt::format("snapshot '{}': malformed manifest: a root disk but no disk_bytes", dir));
            if (config.disk_bytes != 0 && config.disk_bytes != *decoded.disk_bytes)
                throw Error(fmt::format("--disk-size {} MiB: the snapshot was baked with a disk of {} MiB",
                                        config.disk_bytes / layout::mib, *decoded.disk_bytes / layout::mib));
            config.disk_bytes = *decoded.disk_bytes;
        }
        check_host_cpu(kvm, manifest.at("host_cpu"));

        const json& files = manifest.at("files");
        loaded.data.state = read_state(root, files.at(state_name));
        loaded.data.memory = open_large(root, memory_name, files.at(memory_name));
        loaded.data.disk = open_large(root, disk_name, files.at(disk_name));
    } catch (const json::exception& e) {
        throw Error(fmt::format("snapshot '{}': malformed manifest: {}", dir, e.what()));
    }
    loaded.config = std::move(config);
    spdlog::debug("snapshot '{}' checked and its state read", dir);
    return loaded;
}

} // namespace agentvm
