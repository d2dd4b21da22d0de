// Helpers for kvm-tier tests: boot a tiny freestanding guest on the real VMM code and record
// what it reports on the result and trace ports.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/bus.hpp"
#include "common/fd.hpp"
#include "vmm/vm.hpp"

namespace agentvm::test {

// Port 0x500: the guest's return value; port 0x504: progress values in order.
class ResultPorts : public BusDevice {
public:
    void bus_read(uint64_t, std::span<uint8_t> data) override { std::fill(data.begin(), data.end(), 0); }
    void bus_write(uint64_t offset, std::span<const uint8_t> data) override
    {
        uint32_t value = 0;
        std::memcpy(&value, data.data(), std::min(data.size(), sizeof(value)));
        std::lock_guard lock(mutex_);
        if (offset == 0)
            result_ = value;
        else if (offset == 4)
            trace_.push_back(value);
    }
    std::optional<uint32_t> result() const
    {
        std::lock_guard lock(mutex_);
        return result_;
    }
    std::vector<uint32_t> trace() const
    {
        std::lock_guard lock(mutex_);
        return trace_;
    }

private:
    mutable std::mutex mutex_;
    std::optional<uint32_t> result_;
    std::vector<uint32_t> trace_;
};

inline std::string guest_path(const char* name)
{
    return std::string(TINY_GUEST_DIR) + "/" + name;
}

// A memfd that collects the console; read back after the run.
class ConsoleCapture {
public:
    ConsoleCapture() : fd_(::memfd_create("console", MFD_CLOEXEC)) {}
    int fd() const { return fd_.get(); }
    std::string text() const
    {
        std::string out;
        char buf[4096];
        off_t off = 0;
        ssize_t n;
        while ((n = ::pread(fd_.get(), buf, sizeof(buf), off)) > 0) {
            out.append(buf, static_cast<size_t>(n));
            off += n;
        }
        return out;
    }

private:
    Fd fd_;
};

inline VmConfig tiny_config(const char* guest, int console_fd)
{
    VmConfig config;
    config.kernel_path = guest_path(guest);
    config.mem_mib = 64;
    config.console_fd = console_fd;
    config.overlay_dir = "/tmp";
    return config;
}

} // namespace agentvm::test
