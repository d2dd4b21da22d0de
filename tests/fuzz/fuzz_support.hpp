// Shared by the libFuzzer targets of tests/fuzz/: reading a fuzz input as a sequence of fixed
// fields, building seed inputs the same way, handing the seeds to run_fuzzer.sh, and reporting
// a broken invariant as a crash libFuzzer keeps.
//
// A target catches only the exceptions that mean "rejected cleanly" (GuestError, ChainError,
// Error where the API documents it); anything else escapes and libFuzzer reports it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace agentvm::fuzz {

// Reads fields front to back; past the end of the input every field reads as zero, so any
// input, however short, describes a complete run.
class Input {
public:
    Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    template <typename T>
    T take()
    {
        static_assert(std::is_trivially_copyable_v<T>);
        T value{};
        const size_t n = std::min(sizeof(T), remaining());
        if (n != 0)
            std::memcpy(&value, data_ + pos_, n);
        pos_ += n;
        return value;
    }
    uint8_t byte() { return take<uint8_t>(); }
    bool flag() { return (byte() & 1) != 0; }

    std::span<const uint8_t> bytes(size_t n)
    {
        n = std::min(n, remaining());
        std::span<const uint8_t> out(data_ + pos_, n);
        pos_ += n;
        return out;
    }
    std::span<const uint8_t> rest() { return bytes(remaining()); }
    size_t remaining() const { return size_ - pos_; }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

// Writes what Input reads, for seeds.
class Builder {
public:
    template <typename T>
    Builder& put(const T& value)
    {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto* p = reinterpret_cast<const uint8_t*>(&value);
        bytes_.insert(bytes_.end(), p, p + sizeof(T));
        return *this;
    }
    Builder& append(std::span<const uint8_t> bytes)
    {
        bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
        return *this;
    }
    size_t size() const { return bytes_.size(); }
    std::vector<uint8_t> take() { return std::move(bytes_); }

private:
    std::vector<uint8_t> bytes_;
};

using Seeds = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

// Call from LLVMFuzzerInitialize. With AGENTVM_FUZZ_SEEDS=DIR in the environment the target
// writes its own seed inputs into DIR and exits (run_fuzzer.sh does this before fuzzing), so
// the seeds always match the current input layout and state format.
inline void write_seeds_if_asked(const std::function<Seeds()>& make)
{
    const char* dir = std::getenv("AGENTVM_FUZZ_SEEDS");
    if (!dir || !*dir)
        return;
    for (const auto& [name, bytes] : make()) {
        const std::string path = std::string(dir) + "/seed-" + name;
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        if (!out) {
            std::fprintf(stderr, "fuzz: cannot write seed %s\n", path.c_str());
            std::exit(1);
        }
    }
    std::exit(0);
}

// Guest mistakes are logged (rate-limited) by the devices; at thousands of inputs a second
// that is only noise, and slow.
inline void quiet_logs()
{
    spdlog::set_level(spdlog::level::off);
}

// A broken invariant: abort, so libFuzzer saves the input like any other crash.
[[noreturn]] inline void finding(const char* what)
{
    std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
    std::abort();
}

inline void check(bool ok, const char* what)
{
    if (!ok)
        finding(what);
}

} // namespace agentvm::fuzz
