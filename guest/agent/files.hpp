// The write_file and read_file calls (stat and list_dir: file_info.hpp). Data goes straight
// between the request line and the file: a large file arrives as many appending write_file
// calls and leaves as 1 MiB events, so neither direction holds a whole file in memory.
// Both act as root unless the call names a "user", whose file credentials they then take
// (fs_user.hpp); a new file of write_file belongs to the named user, else to the image's.
#pragma once

#include "guest/agent/outbox.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Returns the bytes written. Throws CallError (not_found, io, bad_field for an unknown user).
size_t write_file(const WriteFileRequest& request);

// Sends the data events, returns the final response. Throws CallError (not_found, io) when
// the file cannot be opened or read, bad_field for an unknown user.
Json read_file(const Json& id, const ReadFileRequest& request, Outbox& outbox);

} // namespace agentvm
