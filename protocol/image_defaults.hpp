// The files by which a template's image (templates/, `agentvm template build`) tells the
// guest its defaults for every tool call, one definition for the builder that writes them
// and the guest that reads them. Each is written by our builder; the guest still reads them
// as the image's, i.e. the user's, bytes.
//   /etc/agentvm/env      KEY=VALUE entries, each ended by a NUL byte (as /proc/PID/environ),
//                         so that values may hold newlines; read by init, whose environment
//                         every tool call inherits;
//   /etc/agentvm/workdir  an absolute path, with or without one trailing newline: the tool
//                         calls' working directory;
//   /etc/agentvm/user     "UID:GID" or "UID:GID:G1,G2,..." (supplementary groups), with or
//                         without one trailing newline: the credentials the agent gives every
//                         process it starts (absent: root).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agentvm {

inline constexpr char image_env_path[] = "/etc/agentvm/env";
inline constexpr char image_workdir_path[] = "/etc/agentvm/workdir";
inline constexpr char image_user_path[] = "/etc/agentvm/user";
// Anything larger is not one of ours.
inline constexpr size_t max_image_defaults_bytes = 1024 * 1024;
// The kernel's NGROUPS_MAX.
inline constexpr size_t max_supplementary_groups = 65536;

struct ImageUser {
    uint32_t uid = 0;
    uint32_t gid = 0;
    std::vector<uint32_t> groups;  // supplementary groups

    bool operator==(const ImageUser&) const = default;
};

// A decimal uid or gid, the whole of `text`: no sign, below 2^32 - 1 ((uid_t)-1 means
// "unchanged" to setresuid, so no one has it). nullopt otherwise.
std::optional<uint32_t> parse_image_id(std::string_view text);

// The user file's text (with its trailing newline).
std::string format_image_user(const ImageUser& user);
// nullopt unless `text` is exactly what format_image_user writes: decimal ids below 2^32 - 1
// (which is no id: (uid_t)-1 means "unchanged" to setresuid), at most
// max_supplementary_groups groups.
std::optional<ImageUser> parse_image_user(std::string_view text);

} // namespace agentvm
