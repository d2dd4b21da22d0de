// What parse_request (protocol/agent_protocol.hpp) refuses a line with, for the unit tests of
// the agent's request parsing: one helper, not a copy in each test file.
#pragma once

#include <string>

#include "protocol/agent_protocol.hpp"

namespace agentvm::test {

// "CODE: MESSAGE" of the error a line gets; "" when it parses.
inline std::string request_error(const std::string& line)
{
    try {
        parse_request(line);
        return "";
    } catch (const RequestError& e) {
        return e.error.code() + ": " + e.error.what();
    }
}

// The code alone; "" when the line parses.
inline std::string request_error_code(const std::string& line)
{
    try {
        parse_request(line);
        return "";
    } catch (const RequestError& e) {
        return e.error.code();
    }
}

} // namespace agentvm::test
