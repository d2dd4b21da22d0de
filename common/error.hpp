// agentvm reports failures with exceptions, one style everywhere:
//  - Error: a host or set-up failure (bad flag, missing file, ioctl failed). Fatal to the VM.
//  - GuestError: the guest handed us something malformed. A device catches it, fails the
//    request or itself, and the VMM goes on (see STYLE.md: guest mistakes never kill the VMM).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace agentvm {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class GuestError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Throws Error("<what>: <strerror(errno)>"), capturing errno at the call.
[[noreturn]] void throw_errno(std::string_view what);
[[noreturn]] void throw_errno(std::string_view what, int err);

} // namespace agentvm
