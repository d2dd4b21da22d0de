// The native API's files (docs/api.md, "Files"): raw bytes over HTTP, streamed both ways. An
// upload's body feeds a FileWriter (file_writer.hpp) as it arrives, and waits while the writer
// has no room; a download's body is a FileReader's bytes (file_reader.hpp), and the sandbox's
// output waits while the client has too much unread (StreamPacer). Neither side is ever held
// whole by serve.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "service/http_server.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

// PUT .../files?path=P[&mode=M]; called when the request's headers have arrived.
void start_upload(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                  const std::string& path, std::optional<std::string> mode);
// GET .../files?path=P; E2B's GET /files also names the `user` that reads it.
void start_download(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                    const std::string& path, const std::optional<std::string>& user = std::nullopt);

} // namespace agentvm
