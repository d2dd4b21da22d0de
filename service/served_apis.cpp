#include "service/served_apis.hpp"

namespace agentvm {

ServedApis::ServedApis(SandboxManager& manager, const std::optional<std::string>& token, PeerFetcher* peers)
    : e2b_(manager, token, peers), fusion_(manager, token), native_(manager, token, peers)
{
    router_.add(e2b_);
    router_.add(fusion_);
    router_.add(native_);
}

} // namespace agentvm
