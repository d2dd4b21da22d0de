#include "service/router.hpp"

#include "common/error.hpp"

namespace agentvm {

HttpServer::Admission Router::admit(HttpExchange& head) const
{
    if (facades_.empty())
        throw Error("serve has no API to answer with");
    for (Facade* facade : facades_)
        if (facade->takes(head))
            return facade->admit(head);
    return facades_.back()->admit(head);
}

} // namespace agentvm
