// The context ops (docs/protocol.md, "create_context" and after): a context is one persistent
// interpreter of run_code's, Python or bash, with state of its own; `create_context` makes
// one, `list_contexts` lists them, `restart_context` and `remove_context` end one's process,
// and run_code's "context" names the one a cell runs in.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace agentvm {

enum class CodeLanguage { python, bash };

// "python" or "bash", as the protocol spells them.
std::string_view language_name(CodeLanguage language);

// Context names are the agent's ("default", "default-bash", "ctx-N"); a longer one names none,
// and is refused before it is echoed in an error message.
constexpr size_t max_context_name_bytes = 64;

struct CreateContextRequest {
    CodeLanguage language = CodeLanguage::python;
    std::optional<std::string> cwd;  // absent: the agent's
};

struct ListContextsRequest {};

// Kills the context's process: its state is lost, its next cell starts a fresh one.
struct RestartContextRequest {
    std::string context;
};

// Kills the context's process and forgets the context.
struct RemoveContextRequest {
    std::string context;
};

// Each throws CallError (missing_field, bad_field). (nlohmann::ordered_json is Json, which
// agent_protocol.hpp defines after including this header for its Request variant.)
CreateContextRequest parse_create_context(const nlohmann::ordered_json& object);
RestartContextRequest parse_restart_context(const nlohmann::ordered_json& object);
RemoveContextRequest parse_remove_context(const nlohmann::ordered_json& object);
// run_code's and create_context's "language"; nullopt when absent or null.
std::optional<CodeLanguage> optional_language(const nlohmann::ordered_json& object);
// run_code's "context"; nullopt when absent or null.
std::optional<std::string> optional_context(const nlohmann::ordered_json& object);

} // namespace agentvm
