// What the E2B facade's handlers read of a request the same way: its method, its JSON body
// and its media type. Each refuses what it cannot use with a RefusedRequest.
#pragma once

#include <string>
#include <string_view>

#include "protocol/agent_protocol.hpp"
#include "service/http_server.hpp"

namespace agentvm {

// Refuses (405) a request whose method is not `method`.
void require_method(const HttpExchange& exchange, const char* method);
// The body as a JSON object; an empty body is {} (the SDKs send none for some POSTs and
// DELETEs, and curl need not). Its depth is checked before it is parsed: what is done with a
// parsed body recurses.
Json json_body(const HttpExchange& exchange);
// The media type of a Content-Type, lower-cased, without parameters or blanks around it:
// "Multipart/Form-Data; boundary=x" -> "multipart/form-data".
std::string media_type(std::string_view content_type);

} // namespace agentvm
