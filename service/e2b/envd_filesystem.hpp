// envd's filesystem.Filesystem service (docs/e2b.md, "Filesystem") on the agent's file calls
// (docs/protocol.md): Stat is stat, MakeDir make_dir (then stat, for its entry; a directory
// already there is already_exists), Move move, ListDir list_dir (depth 1 by default), Remove a
// recursive remove (E2B removes trees), and WatchDir a watch streamed as {"start":{}}, then
// one {"filesystem":{name, type}} per change; a watch that lost events ends with data_loss.
// The agent's entries become EntryInfo as envd writes it: mode the permission bits,
// permissions as Go's FileMode prints them, modifiedTime in RFC 3339. An entry that is
// neither file, directory nor symlink has no type, which the SDK's list skips, as it does
// envd's; one whose name is not UTF-8, which protobuf's strings cannot carry, is left out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "service/e2b/connect_stream.hpp"

namespace agentvm {

// The agent's entry (stat's answer, list_dir's entries, move's entry) as EntryInfo; nullopt
// when its name or path is not UTF-8.
std::optional<Json> entry_info(const Json& agent_entry);
// "0644" and its type -> "-rw-r--r--", as Go's os.FileMode.String() (setuid shows as a
// leading u, and so on).
std::string go_permissions(uint32_t mode_bits, const std::string& type);
// Seconds since the epoch -> "2024-05-01T12:00:00.250Z".
std::string rfc3339_time(double seconds);
// A watch's event -> WatchDirResponse; nullopt for the events that have none.
std::optional<Json> watch_event(const Json& agent_event);

void filesystem_stat(RpcCall& call);
void filesystem_make_dir(RpcCall& call);
void filesystem_move(RpcCall& call);
void filesystem_list_dir(RpcCall& call);
void filesystem_remove(RpcCall& call);
void filesystem_watch_dir(RpcCall& call, const std::shared_ptr<ConnectStream>& stream);

} // namespace agentvm
