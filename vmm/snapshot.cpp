#include "vmm/snapshot.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agentvm_config.hpp"
#include "devices/state_json.hpp"
#include "devices/virtio_blk.hpp"
#include "common/error.hpp"
#include "common/file_digest.hpp"
#include "core/layout.hpp"
#include "vmm/partial_dir.hpp"
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

// A file a snapshot holds: a regular file, never followed through a symlink nor waited on as a
// FIFO. A live snapshot's directory was written by a VMM that a guest may have taken over; a
// link in it must not hand a host file to the next VM restored from it.
Fd open_snapshot_file(const std::string& path, const std::string& what)
{
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd)
        throw_errno(fmt::format("{} '{}'", what, path));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
        throw_errno(fmt::format("{} '{}'", what, path));
    if (!S_ISREG(st.st_mode))
        throw Error(fmt::format("{} '{}' is not a regular file", what, path));
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

} // namespace

namespace {

// What every manifest records of the VM's inputs, read before the VMM is jailed.
json inputs_manifest(const Kvm& kvm, const VmConfig& config)
{
    json manifest;
    manifest["format"] = snapshot_format;
    manifest["agentvm_version"] = AGENTVM_VERSION;
    manifest["vcpus"] = config.vcpus;
    manifest["mem_mib"] = config.mem_mib;
    manifest["kernel"] = input_file(config.kernel_path, "kernel");
    if (config.rootfs_path)
        manifest["rootfs"] = input_file(*config.rootfs_path, "root filesystem");
    manifest["host_cpu"] = host_cpu(kvm);
    return manifest;
}

void write_bytes_file(const fs::path& path, const std::string& text)
{
    Fd fd = create_file(path);
    write_all(fd.get(), text.data(), text.size(), path.filename().string());
    if (::fsync(fd.get()) != 0)
        throw_errno(fmt::format("fsync '{}'", path.string()));
}

void check_disk_size(const Vm& vm)
{
    if (vm.disk_bytes() > max_snapshot_disk_sectors * CowDisk::sector_size)
        throw Error(fmt::format("a disk of {} GiB cannot be snapshotted: at most {} GiB", vm.disk_bytes() >> 30,
                                (max_snapshot_disk_sectors * CowDisk::sector_size) >> 30));
}

std::vector<IndexRun> sector_runs(const ByteRanges& ranges)
{
    std::vector<IndexRun> runs;
    for (const auto& [offset, length] : ranges)
        runs.push_back({offset / CowDisk::sector_size, length / CowDisk::sector_size});
    return runs;
}

// Writes state.cbor beside the memory and disk files (written already), records the three in
// the manifest, writes it and renames the snapshot into place.
SnapshotSummary seal(PartialDir& partial, const fs::path& target, json manifest, const std::vector<uint8_t>& state,
                     int memory_fd, int disk_fd)
{
    SnapshotSummary summary;
    summary.dir = target.string();
    Fd state_fd = create_file(partial.path() / state_name);
    write_all(state_fd.get(), state.data(), state.size(), state_name);
    summary.state_bytes = state.size();
    manifest["files"][state_name] = stored_file(state_fd.get(), partial.path() / state_name);
    manifest["files"][memory_name] = stored_file(memory_fd, partial.path() / memory_name);
    manifest["files"][disk_name] = stored_file(disk_fd, partial.path() / disk_name);
    struct stat st {};
    if (::fstat(memory_fd, &st) == 0)
        summary.memory_data_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    if (::fstat(disk_fd, &st) == 0)
        summary.disk_data_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    write_bytes_file(partial.path() / manifest_name, manifest.dump(2) + "\n");
    partial.commit(target);
    return summary;
}

} // namespace

SnapshotWriter::SnapshotWriter(const Kvm& kvm, const VmConfig& config, const std::string& dir)
    : target_(fs::absolute(dir)), dir_(dir)
{
    if (fs::exists(target_))
        throw Error(fmt::format("snapshot directory '{}' already exists; remove it or choose another --out", dir));
    if (!fs::is_directory(target_.parent_path()))
        throw Error(fmt::format("cannot create snapshot directory '{}': '{}' is not a directory", dir,
                                target_.parent_path().string()));
    manifest_ = inputs_manifest(kvm, config);
}

SnapshotWriter::SnapshotWriter(const Kvm& kvm, const VmConfig& config, std::optional<SnapshotOrigin> origin)
{
    if (!origin) {
        manifest_ = inputs_manifest(kvm, config);
        return;
    }
    manifest_ = origin->inputs;
    manifest_["format"] = snapshot_format;
    manifest_["agentvm_version"] = AGENTVM_VERSION;
    manifest_["vcpus"] = config.vcpus;
    manifest_["mem_mib"] = config.mem_mib;
    origin_ = std::move(origin->parent);
}

std::unique_ptr<LiveSnapshot> SnapshotWriter::begin_live(Vm& vm, const std::string& dir) const
{
    const fs::path target = fs::absolute(dir);
    if (fs::exists(target))
        throw Error(fmt::format("snapshot directory '{}' already exists", dir));
    if (!fs::is_directory(target.parent_path()))
        throw Error(fmt::format("cannot create snapshot directory '{}': '{}' is not a directory", dir,
                                target.parent_path().string()));
    if (origin_ && origin_->depth + 1 > max_snapshot_depth)
        throw Error(fmt::format("the VM was restored from a snapshot {} deep, and a chain of live snapshots "
                                "goes at most {} deep",
                                origin_->depth, max_snapshot_depth));
    check_disk_size(vm);
    std::unique_ptr<LiveSnapshot> live(new LiveSnapshot);
    live->partial_.emplace(target);
    live->target_ = target;
    live->manifest_ = manifest_;
    if (vm.disk_bytes() != 0)
        live->manifest_["disk_bytes"] = vm.disk_bytes();
    live->origin_ = origin_;
    live->memory_ = create_file(live->partial_->path() / memory_name);
    live->disk_ = create_file(live->partial_->path() / disk_name);
    if (origin_)
        live->disk_to_copy_ = vm.start_live_copy();
    return live;
}

LiveSnapshot::~LiveSnapshot() = default;

void LiveSnapshot::copy_running(const Vm& vm)
{
    if (origin_)
        vm.copy_live(copy_, disk_to_copy_, memory_.get(), disk_.get());
}

void LiveSnapshot::capture(Vm& vm)
{
    state_ = vm.save_state();
    if (origin_) {
        vm.finish_live_copy(copy_, memory_.get(), disk_.get());
        state_["layer"] = {{"memory", state_codec::runs_to_json(copy_.pages)},
                           {"disk", state_codec::runs_to_json(sector_runs(copy_.disk))}};
    } else {
        vm.save_memory(memory_.get());
        vm.save_disk(disk_.get());
    }
}

SnapshotSummary LiveSnapshot::finish()
{
    json manifest = manifest_;
    if (origin_)
        manifest["parent"] = {{"dir", origin_->dir},
                              {"manifest_digest", origin_->manifest_digest},
                              {"depth", origin_->depth + 1}};
    return seal(*partial_, target_, std::move(manifest), encode_cbor(state_), memory_.get(), disk_.get());
}

SnapshotSummary SnapshotWriter::write(const Vm& vm) const
{
    if (fs::exists(target_))
        throw Error(fmt::format("snapshot directory '{}' already exists; remove it or choose another --out", dir_));
    PartialDir partial(target_);
    json manifest = manifest_;
    check_disk_size(vm);
    if (vm.disk_bytes() != 0)
        manifest["disk_bytes"] = vm.disk_bytes();
    const std::vector<uint8_t> state = encode_cbor(vm.save_state());
    Fd memory_fd = create_file(partial.path() / memory_name);
    vm.save_memory(memory_fd.get());
    Fd disk_fd = create_file(partial.path() / disk_name);
    vm.save_disk(disk_fd.get());
    return seal(partial, target_, std::move(manifest), state, memory_fd.get(), disk_fd.get());
}

namespace {

// A snapshot's own file, opened: its size must be the recorded one.
Fd open_stored(const fs::path& path, const json& record)
{
    Fd fd = open_snapshot_file(path.string(), "snapshot file");
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

namespace {

// One snapshot of a chain below the one restored: its manifest checked against the digest
// its child recorded, its state read (its layer lists), its memory and disk opened.
struct ChainLink {
    std::string dir;
    SnapshotManifest manifest;
    json state;
    Fd memory;
    Fd disk;
};

std::vector<uint8_t> read_manifest_bytes(const fs::path& dir)
{
    Fd fd = open_snapshot_file((dir / manifest_name).string(), "snapshot manifest");
    return read_file_bytes(fd.get(), max_manifest_bytes, manifest_name);
}

ChainLink open_parent(const std::string& child, const SnapshotParent& parent, const ManifestLimits& limits)
{
    std::vector<uint8_t> bytes;
    try {
        bytes = read_manifest_bytes(parent.dir);
    } catch (const Error& e) {
        throw Error(fmt::format("snapshot '{}' is stored as changes over '{}', which is missing or unreadable: {}",
                                child, parent.dir, e.what()));
    }
    if (sha256_hex(bytes) != parent.manifest_digest)
        throw Error(fmt::format("snapshot '{}' is stored as changes over '{}', which has been altered or replaced "
                                "since (its manifest.json is not the one recorded)",
                                child, parent.dir));
    ChainLink link;
    link.dir = parent.dir;
    try {
        link.manifest = decode_manifest(bytes, limits);
        const uint32_t depth = link.manifest.parent ? link.manifest.parent->depth : 0;
        if (depth + 1 != parent.depth)
            throw Error(fmt::format("it is {} deep, its child says {}", depth, parent.depth - 1));
        const fs::path root(parent.dir);
        const json& files = link.manifest.doc.at("files");
        link.state = read_state(root, files.at(state_name));
        link.memory = open_large(root, memory_name, files.at(memory_name));
        link.disk = open_large(root, disk_name, files.at(disk_name));
    } catch (const json::exception& e) {
        throw Error(fmt::format("snapshot '{}': malformed manifest: {}", parent.dir, e.what()));
    } catch (const Error& e) {
        throw Error(fmt::format("snapshot '{}' (below '{}'): {}", parent.dir, child, e.what()));
    }
    return link;
}

// A baked snapshot's disk file holds the sectors its state's disk bitmap marks.
ByteRanges bitmap_ranges(const json& state, uint64_t capacity_sectors)
{
    const auto blk = state_from_json<VirtioBlk::State>(state.at("blk").at("device"), "blk.device");
    if (blk.disk.capacity_sectors != capacity_sectors || blk.disk.written.size() != (capacity_sectors + 63) / 64)
        throw Error("snapshot: blk.device: a disk of another size than the snapshot records");
    ByteRanges ranges;
    const auto bit = [&](uint64_t s) { return (blk.disk.written[s / 64] >> (s % 64)) & 1; };
    for (uint64_t s = 0; s < capacity_sectors;) {
        if (!bit(s)) {
            ++s;
            continue;
        }
        const uint64_t first = s;
        while (s < capacity_sectors && bit(s))
            ++s;
        ranges.emplace_back(first * CowDisk::sector_size, (s - first) * CowDisk::sector_size);
    }
    return ranges;
}

// A live snapshot's own pages and sectors, as its state lists them.
void add_layer(VmSnapshotData& data, const json& state, Fd memory, Fd disk, uint64_t ram_pages,
               uint64_t disk_sectors)
{
    // disk_sectors 0: a VM without a root disk, whose disk files are empty.
    const json& layer = state.at("layer");
    auto pages = state_codec::runs_from_json(layer.at("memory"), "layer.memory", ram_pages, "page", "guest RAM's");
    if (pages.size() > max_snapshot_page_runs)
        throw Error(fmt::format("snapshot: layer.memory: {} runs of pages, more than the {} a snapshot stores",
                                pages.size(), max_snapshot_page_runs));
    ByteRanges ranges;
    for (const IndexRun& run : state_codec::runs_from_json(layer.at("disk"), "layer.disk", disk_sectors, "sector",
                                                           "the disk's"))
        ranges.emplace_back(run.first * CowDisk::sector_size, run.count * CowDisk::sector_size);
    data.memory_layers.push_back({std::move(memory), std::move(pages)});
    if (disk_sectors != 0)
        data.disk_layers.emplace_back(std::move(disk), std::move(ranges));
}

// The chain below a live snapshot, walked down to its baked root: the root's memory and
// disk at the bottom, each live snapshot's pages and sectors over them, the leaf's on top.
void load_chain(VmSnapshotData& data, const std::string& dir, const SnapshotManifest& leaf,
                const ManifestLimits& limits)
{
    const uint64_t ram_pages = leaf.mem_mib * layout::mib / layout::page_size;
    const uint64_t disk_sectors = leaf.disk_bytes.value_or(0) / CowDisk::sector_size;
    std::vector<ChainLink> below;  // the leaf's parent first
    std::string child = dir;
    std::optional<SnapshotParent> next = leaf.parent;
    while (next) {
        ChainLink link = open_parent(child, *next, limits);
        const SnapshotManifest& m = link.manifest;
        if (m.vcpus != leaf.vcpus || m.mem_mib != leaf.mem_mib || m.disk_bytes != leaf.disk_bytes)
            throw Error(fmt::format("snapshot '{}' is stored over '{}', a VM of another size", child, link.dir));
        child = link.dir;
        next = m.parent;
        below.push_back(std::move(link));
    }
    VmSnapshotData chain;
    ChainLink& root = below.back();
    chain.memory = std::move(root.memory);
    if (disk_sectors != 0)
        chain.disk_layers.emplace_back(std::move(root.disk), bitmap_ranges(root.state, disk_sectors));
    for (size_t i = below.size() - 1; i-- > 0;)
        add_layer(chain, below[i].state, std::move(below[i].memory), std::move(below[i].disk), ram_pages,
                  disk_sectors);
    add_layer(chain, data.state, std::move(data.memory), std::move(data.disk), ram_pages, disk_sectors);
    chain.state = std::move(data.state);
    data = std::move(chain);
}

} // namespace

LoadedSnapshot load_snapshot(const Kvm& kvm, const std::string& dir, VmConfig config)
{
    const fs::path root(dir);
    const auto manifest_bytes = read_manifest_bytes(root);
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
        if (decoded.parent)
            load_chain(loaded.data, dir, decoded, limits);
    } catch (const json::exception& e) {
        throw Error(fmt::format("snapshot '{}': malformed manifest: {}", dir, e.what()));
    }
    loaded.origin.parent = {fs::absolute(root).lexically_normal().string(), sha256_hex(manifest_bytes),
                            decoded.parent ? decoded.parent->depth : 0};
    for (const char* input : {"kernel", "rootfs", "host_cpu"})
        if (decoded.doc.contains(input))
            loaded.origin.inputs[input] = decoded.doc[input];
    loaded.config = std::move(config);
    spdlog::debug("snapshot '{}' checked and its state read", dir);
    return loaded;
}

} // namespace agentvm
