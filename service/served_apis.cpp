#include "service/served_apis.hpp"

namespace agentvm {

ServedApis::ServedApis(SandboxManager& manager, const std::optional<std::string>& token)
    : fusion_(manager, token), native_(manager, token)
{
    router_.add(fusion_);
    router_.add(native_);
}

} // namespace agentvm
