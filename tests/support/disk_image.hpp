// Shared by the disk tests: a temporary directory that removes itself, and a base image whose
// every byte is a known function of its position.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace agentvm::test {

struct TempDir {
    std::string path;
    TempDir()
    {
        std::string tmpl = "/tmp/agentvm-test-XXXXXX";
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    size_t entries() const
    {
        size_t n = 0;
        for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path))
            ++n;
        return n;
    }
};

inline uint8_t base_byte(uint64_t sector, size_t i)
{
    return static_cast<uint8_t>(sector * 31 + i);
}

inline std::vector<uint8_t> base_sector(uint64_t s)
{
    std::vector<uint8_t> v(512);
    for (size_t i = 0; i < 512; ++i)
        v[i] = base_byte(s, i);
    return v;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes)
{
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path)
{
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

} // namespace agentvm::test
