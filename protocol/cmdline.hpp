// How agentvm's parameters travel on the kernel command line. Pure string functions, so
// tests/unit/test_guest_cmdline.cpp can check them on the host.
//
// The VMM passes the command to run as agentvm.init_cmd=<base64 of the command>: base64
// (RFC 4648, standard alphabet, '=' padding) keeps quotes, spaces and newlines from being
// split or eaten by the kernel's parameter parser. The kernel never hands parameters with a
// dot in their name to init, so init reads them from /proc/cmdline.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace agentvm {

inline constexpr std::string_view init_cmd_param = "agentvm.init_cmd";
// Present (no value): run no command and no shell, only the agent, until the host ends the VM.
inline constexpr std::string_view serve_param = "agentvm.serve";
// Present (no value): the root disk is larger than its filesystem (agentvm --disk-size);
// init grows the filesystem to fill it before anything runs.
inline constexpr std::string_view grow_root_param = "agentvm.grow_root";
// agentvm.pids_max=N: at most N processes and threads in the tool calls' cgroup at once
// (default_pids_max without it), so a fork bomb meets EAGAIN instead of exhausting the guest.
inline constexpr std::string_view pids_max_param = "agentvm.pids_max";
inline constexpr uint32_t default_pids_max = 1024;
// The kernel's own ceiling on process ids (PID_MAX_LIMIT on 64-bit).
inline constexpr uint32_t max_pids_max = 4194304;

// The value of parameter `name` in a kernel command line as /proc/cmdline shows it, split
// and unquoted the way the kernel's own parser (lib/cmdline.c next_arg) does: words end at
// whitespace outside double quotes, '-' and '_' in names are the same character, a bare
// `name` has the value "", the last occurrence wins, and "--" ends the kernel's parameters
// (what follows belongs to init). nullopt when the parameter is absent.
std::optional<std::string> find_cmdline_param(std::string_view cmdline, std::string_view name);

// The value of agentvm.pids_max: decimal digits only, 1 to max_pids_max; nullopt otherwise.
std::optional<uint32_t> parse_pids_max(std::string_view value);


} // namespace agentvm
