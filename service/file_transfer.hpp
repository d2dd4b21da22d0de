// Files in and out of a sandbox as raw bytes over HTTP (docs/api.md, "Files"), streamed both
// ways: an upload goes to the guest in write_file chunks as its body arrives (at most two
// chunks in flight; the body waits meanwhile), a download leaves as read_file's data events
// come, so neither side is ever held whole by serve.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "service/http_server.hpp"
#include "service/sandbox.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

// PUT .../files?path=P[&mode=M]; called when the request's headers have arrived.
void start_upload(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                  const std::string& path, std::optional<std::string> mode);
// GET .../files?path=P
void start_download(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                    const std::string& path);

} // namespace agentvm
