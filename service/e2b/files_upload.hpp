// envd's POST /files (docs/e2b.md, "Files"): the files a request's body carries, written into
// the sandbox as the body streams in. A multipart/form-data body (MultipartBody) holds one file
// a part named "file", its filename the file's path (or the ?path= of a one-file request); a
// raw application/octet-stream body is one file, at ?path=. Each file's directory is made
// first (the agent's make_dir, as envd does: writing a file makes its parents), then its bytes
// go through a FileWriter in write_file chunks, the body waiting while a writer has no room.
// The answer, once every file is written, is envd's: [{"name","type":"file","path"}, ...].
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "service/http_server.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

// Called when the request's headers have arrived (its body streams). `path`: the ?path=
// (UTF-8, not empty); `user`: the ?username= the agent's file calls run as.
void start_files_upload(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                        std::optional<std::string> path, std::optional<std::string> user);

// Refuses an upload from its handler, once its body has started to come. An answer queued
// before the body is read is sent at once and the connection closed while the client still
// sends (the SDKs write a chunked body after the head), which its HTTP client reports as a
// broken pipe, not as the answer; the server reads and drops what comes after (up to its
// bound) and sends the answer once the body is whole.
void refuse_upload(const std::shared_ptr<HttpExchange>& exchange, Refusal refusal);

} // namespace agentvm
