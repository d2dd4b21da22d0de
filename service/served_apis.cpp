#include "service/served_apis.hpp"

namespace agentvm {

ServedApis::ServedApis(SandboxManager& manager, const std::optional<std::string>& token, PeerFetcher* peers)
    : ports_(manager.loop()), e2b_(manager, token, ports_, peers), fusion_(manager, token),
      native_(manager, token, ports_, peers)
{
    router_.add(e2b_);
    router_.add(fusion_);
    router_.add(native_);
}

} // namespace agentvm
