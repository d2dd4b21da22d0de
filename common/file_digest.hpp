// SHA-256 digests (Nettle: small, so it adds little to agentvm's start-up) of what a snapshot records: its own files, and the
// kernel and rootfs it was baked from.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace agentvm {

// Hex SHA-256 of bytes.
std::string sha256_hex(std::span<const uint8_t> bytes);
std::string sha256_hex(std::string_view text);

// Hex SHA-256 of a file's content that does not depend on how sparse the file is: it covers
// the runs of 4 KiB pages that are not all zero, each as (offset, length, bytes), then the
// size. Holes are skipped unread, so a 4 GiB memory image with 100 MiB of data costs about
// 100 MiB of hashing, while a copy that wrote its zeros out still has the same digest, and
// any changed byte changes it. Throws Error naming `name`.
std::string content_digest(int fd, const std::string& name);
// The same digest of a file's content already read into memory: equal to content_digest() of
// a file holding `bytes`, so a small file can be read once and the bytes checked are the bytes used.
std::string content_digest(std::span<const uint8_t> bytes);
// content_digest() of the file at `path`, opened here. Throws Error naming it.
std::string content_digest_of(const std::string& path);

// What identifies a file's content without reading it: if all of these are unchanged the
// file has not been written since (ctime cannot be set back by anyone but the kernel).
struct FileStamp {
    uint64_t dev = 0;
    uint64_t ino = 0;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    bool operator==(const FileStamp&) const = default;
};

FileStamp file_stamp(int fd, const std::string& name);

} // namespace agentvm
