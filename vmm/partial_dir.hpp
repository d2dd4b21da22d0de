// A snapshot directory being written: made beside its target under a random name, renamed into
// place by commit(), removed with everything in it if dropped before, so a failed or crashed
// write leaves no half snapshot under the target's name.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <random>
#include <system_error>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

class PartialDir {
public:
    explicit PartialDir(const std::filesystem::path& target)
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
            std::filesystem::remove_all(path_, ec);
        }
    }
    PartialDir(const PartialDir&) = delete;
    PartialDir& operator=(const PartialDir&) = delete;

    const std::filesystem::path& path() const { return path_; }
    void commit(const std::filesystem::path& target)
    {
        if (::rename(path_.c_str(), target.c_str()) != 0)
            throw_errno(fmt::format("renaming the snapshot into '{}'", target.string()));
        path_.clear();
    }

private:
    std::filesystem::path path_;
};

} // namespace agentvm
