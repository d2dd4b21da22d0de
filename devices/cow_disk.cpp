#include "devices/cow_disk.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fmt/format.h>
#include <memory>
#include <stdexcept>

#include "common/error.hpp"

namespace agentvm {

namespace {

uint64_t image_size(int fd, const std::string& name)
{
    struct stat st {};
    if (::fstat(fd, &st) != 0)
        throw_errno(fmt::format("stat of disk image {}", name));
    if (S_ISREG(st.st_mode))
        return static_cast<uint64_t>(st.st_size);
    if (S_ISBLK(st.st_mode)) {
        uint64_t bytes = 0;
        if (::ioctl(fd, BLKGETSIZE64, &bytes) != 0)
            throw_errno(fmt::format("size of block device {}", name));
        return bytes;
    }
    throw Error(fmt::format("disk image {} is neither a regular file nor a block device", name));
}

Fd open_read_only(const std::string& path)
{
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
        throw_errno(fmt::format("opening base disk image {}", path));
    return fd;
}

std::string default_overlay_dir()
{
    const char* tmp = std::getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/var/tmp";
}

uint64_t total_bytes(std::span<const iovec> iov)
{
    uint64_t total = 0;
    for (const auto& v : iov)
        total += v.iov_len;  // each is a guest buffer < 4 GiB, and there are at most IOV_MAX
    return total;
}

// Several submissions that finish as one request: the last completion reports.
struct SplitOp {
    std::vector<std::vector<iovec>> parts;
    size_t remaining = 0;
    int32_t error = 0;
    int32_t total = 0;
    std::function<void(int32_t)> done;

    void complete_part(int32_t res, uint64_t expected)
    {
        if (res < 0 && error == 0)
            error = res;
        else if (res >= 0 && static_cast<uint64_t>(res) != expected && error == 0)
            error = -EIO;  // a short transfer on a file we sized ourselves means it changed under us
        if (--remaining == 0)
            done(error != 0 ? error : total);
    }
};

} // namespace

std::vector<iovec> slice_iovecs(std::span<const iovec> iov, uint64_t offset, uint64_t len)
{
    std::vector<iovec> out;
    for (const auto& v : iov) {
        if (len == 0)
            break;
        if (offset >= v.iov_len) {
            offset -= v.iov_len;
            continue;
        }
        const uint64_t take = std::min<uint64_t>(v.iov_len - offset, len);
        out.push_back({static_cast<uint8_t*>(v.iov_base) + offset, take});
        len -= take;
        offset = 0;
    }
    if (len != 0)
        throw std::out_of_range("iovec slice runs past the buffers");
    return out;
}

CowDisk::CowDisk(const std::string& base_path, const std::string& overlay_dir, uint64_t capacity_bytes)
    : CowDisk(open_read_only(base_path), base_path, overlay_dir, capacity_bytes)
{
}

CowDisk::CowDisk(Fd base, const std::string& name, const std::string& overlay_dir, uint64_t capacity_bytes)
    : base_(std::move(base)), name_(name)
{
    if (!base_)
        throw Error(fmt::format("disk image {}: no file descriptor", name));
    const uint64_t bytes = image_size(base_.get(), name);
    if (bytes == 0 || bytes % sector_size != 0)
        throw Error(fmt::format("disk image {} is {} bytes, not a non-zero multiple of {}", name, bytes,
                                sector_size));
    if (capacity_bytes == 0)
        capacity_bytes = bytes;
    if (capacity_bytes < bytes || capacity_bytes % sector_size != 0)
        throw Error(fmt::format("a disk of {} bytes cannot hold its image {} of {} bytes", capacity_bytes, name,
                                bytes));
    if (capacity_bytes > max_capacity_bytes)
        throw Error(fmt::format("disk {} is too large ({} bytes)", name, capacity_bytes));
    base_sectors_ = bytes / sector_size;
    capacity_sectors_ = capacity_bytes / sector_size;
    written_.assign((capacity_sectors_ + 63) / 64, 0);
    open_overlay(overlay_dir.empty() ? default_overlay_dir() : overlay_dir);
}

void CowDisk::open_overlay(const std::string& dir)
{
    overlay_ = Fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!overlay_ && (errno == EOPNOTSUPP || errno == EISDIR)) {
        // The filesystem has no O_TMPFILE: create and unlink at once. The name exists for
        // an instant only, and the fd keeps the data alive.
        std::string path = dir + "/agentvm-overlay-XXXXXX";
        overlay_ = Fd(::mkostemp(path.data(), O_CLOEXEC));
        if (overlay_)
            ::unlink(path.c_str());
    }
    if (!overlay_)
        throw_errno(fmt::format("creating the disk overlay for {} in {}", name_, dir));
    // Sparse: the overlay costs only what the guest writes.
    if (::ftruncate(overlay_.get(), static_cast<off_t>(capacity_sectors_ * sector_size)) != 0)
        throw_errno(fmt::format("sizing the disk overlay for {} in {}", name_, dir));
}

bool CowDisk::in_range(uint64_t sector, uint64_t count) const
{
    return sector <= capacity_sectors_ && count <= capacity_sectors_ - sector;
}

namespace {

bool bit(const std::vector<uint64_t>& bitmap, uint64_t sector)
{
    return sector / 64 < bitmap.size() && (bitmap[sector / 64] >> (sector % 64)) & 1;
}

// The sectors `holds` says yes to, as byte ranges; whole zero words of `any` are skipped.
template <typename Holds>
std::vector<std::pair<uint64_t, uint64_t>> byte_ranges(uint64_t sectors, const std::vector<uint64_t>& any,
                                                       Holds holds)
{
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (uint64_t s = 0; s < sectors;) {
        if (s % 64 == 0 && any[s / 64] == 0) {
            s += 64;
            continue;
        }
        if (!holds(s)) {
            ++s;
            continue;
        }
        const uint64_t start = s;
        while (s < sectors && holds(s))
            ++s;
        ranges.emplace_back(start * CowDisk::sector_size, (s - start) * CowDisk::sector_size);
    }
    return ranges;
}

} // namespace

bool CowDisk::in_overlay(uint64_t sector) const
{
    return bit(written_, sector);
}

std::optional<uint32_t> CowDisk::layer_of(uint64_t sector) const
{
    for (size_t i = layers_.size(); i-- > 0;)
        if (bit(layers_[i].sectors, sector))
            return static_cast<uint32_t>(i);
    return std::nullopt;
}

std::vector<std::pair<uint64_t, uint64_t>> CowDisk::overlay_byte_ranges() const
{
    return byte_ranges(capacity_sectors_, written_, [this](uint64_t s) { return in_overlay(s); });
}

std::vector<std::pair<uint64_t, uint64_t>> CowDisk::layer_byte_ranges(size_t index) const
{
    const Layer& layer = layers_.at(index);
    return byte_ranges(capacity_sectors_, layer.sectors,
                       [this, index](uint64_t s) { return !in_overlay(s) && layer_of(s) == index; });
}

bool CowDisk::is_written(uint64_t sector) const
{
    return in_overlay(sector) || layer_of(sector).has_value();
}

std::vector<CowDisk::Extent> CowDisk::plan_read(uint64_t sector, uint64_t count) const
{
    if (!in_range(sector, count))
        throw GuestError(fmt::format("sectors [{}, +{}) are outside the disk of {} sectors", sector, count,
                                     capacity_sectors_));
    std::vector<Extent> plan;
    for (uint64_t s = sector; s < sector + count; ++s) {
        // Past the base's end the overlay's holes are the disk's zeros.
        const std::optional<uint32_t> layer = in_overlay(s) ? std::nullopt : layer_of(s);
        const Source source = in_overlay(s)         ? Source::overlay
                              : layer               ? Source::layer
                              : s >= base_sectors_ ? Source::overlay
                                                    : Source::base;
        const uint32_t index = layer.value_or(0);
        if (!plan.empty() && plan.back().source == source && plan.back().layer == index)
            ++plan.back().count;
        else
            plan.push_back({s, 1, source, index});
    }
    return plan;
}

int CowDisk::fd_of(const Extent& extent) const
{
    switch (extent.source) {
    case Source::base:
        return base_.get();
    case Source::layer:
        return layers_.at(extent.layer).file.get();
    case Source::overlay:
        break;
    }
    return overlay_.get();
}

void CowDisk::mark_written(uint64_t sector, uint64_t count)
{
    if (!in_range(sector, count))
        throw GuestError(fmt::format("sectors [{}, +{}) are outside the disk of {} sectors", sector, count,
                                     capacity_sectors_));
    for (uint64_t s = sector; s < sector + count; ++s) {
        written_[s / 64] |= uint64_t{1} << (s % 64);
        if (!tracked_.empty())
            tracked_[s / 64] |= uint64_t{1} << (s % 64);
    }
}

void CowDisk::track_writes()
{
    tracked_.assign(written_.size(), 0);
}

std::vector<std::pair<uint64_t, uint64_t>> CowDisk::tracked_byte_ranges()
{
    std::vector<uint64_t> tracked = std::move(tracked_);
    tracked_.clear();
    if (tracked.empty())
        return {};
    return byte_ranges(capacity_sectors_, tracked, [&tracked](uint64_t s) { return bit(tracked, s); });
}

uint64_t CowDisk::check_request(uint64_t sector, std::span<const iovec> iov) const
{
    if (iov.size() > IOV_MAX)
        throw GuestError(fmt::format("disk request with {} buffers, more than {}", iov.size(), IOV_MAX));
    const uint64_t bytes = total_bytes(iov);
    if (bytes % sector_size != 0)
        throw GuestError(fmt::format("disk request of {} bytes is not a multiple of {}", bytes, sector_size));
    if (bytes > INT32_MAX)
        throw GuestError(fmt::format("disk request of {} bytes is too large", bytes));
    if (!in_range(sector, bytes / sector_size))
        throw GuestError(fmt::format("sectors [{}, +{}) are outside the disk of {} sectors", sector,
                                     bytes / sector_size, capacity_sectors_));
    return bytes;
}

void CowDisk::read(EventLoop& loop, uint64_t sector, std::span<const iovec> iov, Completion done)
{
    const uint64_t bytes = check_request(sector, iov);
    if (bytes == 0) {
        done(0);
        return;
    }
    const auto plan = plan_read(sector, bytes / sector_size);
    auto op = std::make_shared<SplitOp>();
    op->total = static_cast<int32_t>(bytes);
    op->done = std::move(done);
    op->remaining = plan.size();
    for (const Extent& e : plan)
        op->parts.push_back(slice_iovecs(iov, (e.sector - sector) * sector_size, e.count * sector_size));
    for (size_t i = 0; i < plan.size(); ++i) {
        const Extent& e = plan[i];
        const int fd = fd_of(e);
        const uint64_t expected = e.count * sector_size;
        loop.readv(fd, op->parts[i].data(), static_cast<unsigned>(op->parts[i].size()), e.sector * sector_size,
                   [op, expected](int32_t res) { op->complete_part(res, expected); });
    }
}

void CowDisk::write(EventLoop& loop, uint64_t sector, std::span<const iovec> iov, Completion done)
{
    const uint64_t bytes = check_request(sector, iov);
    if (bytes == 0) {
        done(0);
        return;
    }
    auto parts = std::make_shared<std::vector<iovec>>(iov.begin(), iov.end());
    // Only the overlay is ever written; the base fd is read-only besides.
    loop.writev(overlay_.get(), parts->data(), static_cast<unsigned>(parts->size()), sector * sector_size,
                [this, parts, sector, bytes, done = std::move(done)](int32_t res) {
                    if (res >= 0 && static_cast<uint64_t>(res) != bytes)
                        res = -EIO;
                    if (res >= 0)
                        mark_written(sector, bytes / sector_size);
                    done(res);
                });
}

CowDisk::State CowDisk::save() const
{
    State state{capacity_sectors_, written_};
    for (const Layer& layer : layers_)
        for (size_t i = 0; i < layer.sectors.size(); ++i)
            state.written[i] |= layer.sectors[i];
    return state;
}

void CowDisk::push_layer(Fd file, std::vector<uint64_t> sectors)
{
    if (!file)
        throw Error(fmt::format("disk {}: no file for a layer's sectors", name_));
    if (std::any_of(written_.begin(), written_.end(), [](uint64_t w) { return w != 0; }))
        throw Error(fmt::format("disk {} has been written; a layer goes under an empty overlay", name_));
    if (layers_.size() >= max_layers)
        throw Error(fmt::format("disk {} has {} layers already, the most a disk reads through", name_, max_layers));
    layers_.push_back({std::move(file), std::move(sectors)});
}

void CowDisk::restore(const State& s, Fd layer)
{
    if (s.capacity_sectors != capacity_sectors_)
        throw Error(fmt::format("disk state for {} sectors, disk {} has {}", s.capacity_sectors, name_,
                                capacity_sectors_));
    if (s.written.size() != written_.size())
        throw Error(fmt::format("disk state bitmap has {} words, expected {}", s.written.size(), written_.size()));
    if (capacity_sectors_ % 64 != 0 && (s.written.back() >> (capacity_sectors_ % 64)) != 0)
        throw Error("disk state marks sectors beyond the end of the disk");
    if (!layer)
        throw Error(fmt::format("restoring disk {}: no file for the snapshot's sectors", name_));
    if (!layers_.empty() || std::any_of(written_.begin(), written_.end(), [](uint64_t w) { return w != 0; }))
        throw Error(fmt::format("disk {} was written or restored before; a restore needs a fresh disk", name_));
    push_layer(std::move(layer), s.written);
}

void CowDisk::add_layer(Fd layer, std::span<const std::pair<uint64_t, uint64_t>> byte_ranges)
{
    std::vector<uint64_t> sectors(written_.size(), 0);
    for (const auto& [offset, length] : byte_ranges) {
        if (offset % sector_size != 0 || length % sector_size != 0)
            throw Error(fmt::format("disk {}: layer range at byte {} of {} bytes is not whole sectors", name_, offset,
                                    length));
        const uint64_t first = offset / sector_size;
        const uint64_t count = length / sector_size;
        if (!in_range(first, count))
            throw Error(fmt::format("disk {}: layer range at byte {} of {} bytes leaves the disk ({} bytes)", name_,
                                    offset, length, capacity_sectors_ * sector_size));
        for (uint64_t s = first; s < first + count; ++s)
            sectors[s / 64] |= uint64_t{1} << (s % 64);
    }
    push_layer(std::move(layer), std::move(sectors));
}

} // namespace agentvm
