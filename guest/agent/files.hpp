// The write_file and read_file calls (stat and list_dir: file_info.hpp). Data goes straight
// between the request line and the file: a large file arrives as many appending write_file
// calls and leaves as 1 MiB events, so neither direction holds a whole file in memory.
#pragma once

#include "guest/agent/outbox.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Returns the bytes written. Throws CallError (not_found, io).
size_t write_file(const WriteFileRequest& request);

// Sends the data events, returns the final response. Throws CallError (not_found, io) when
// the file cannot be opened or read.
Json read_file(const Json& id, const ReadFileRequest& request, Outbox& outbox);

} // namespace agentvm
