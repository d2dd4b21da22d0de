// The file-system ops beyond reading and writing a file (docs/protocol.md): make_dir, move,
// remove and watch, and list_dir's depth. agent_protocol.hpp includes this header for its
// Request variant, so it cannot include that one: the parsers name the JSON type themselves
// (it is agent_protocol.hpp's Json).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace agentvm {

// mkdir -p: the directory and its missing parents.
struct MakeDirRequest {
    std::string path;
    std::optional<uint32_t> mode;  // exactly this mode on what it creates; default 0755
    std::optional<std::string> user;
};

constexpr uint32_t default_make_dir_mode = 0755;

// rename(2).
struct MoveRequest {
    std::string from;
    std::string to;
    std::optional<std::string> user;
};

// A file, a symlink or a directory; a non-empty directory only with `recursive`.
struct RemoveRequest {
    std::string path;
    bool recursive = false;
    std::optional<std::string> user;
};

// Reports changes under a directory until cancelled (a long call).
struct WatchRequest {
    std::string path;
    bool recursive = false;  // subdirectories too, also those that appear later
    std::optional<std::string> user;
};

// list_dir's "depth": how many levels of subdirectories it lists.
constexpr uint32_t max_list_depth = 64;

// Each throws CallError (missing_field, bad_field). Every one takes a "user" (request_fields.hpp).
MakeDirRequest parse_make_dir(const nlohmann::ordered_json& object);
MoveRequest parse_move(const nlohmann::ordered_json& object);
RemoveRequest parse_remove(const nlohmann::ordered_json& object);
WatchRequest parse_watch(const nlohmann::ordered_json& object);
// "depth": 1 to max_list_depth; absent or null: 1.
uint32_t parse_list_depth(const nlohmann::ordered_json& object);

} // namespace agentvm
