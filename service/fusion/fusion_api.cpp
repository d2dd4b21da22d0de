#include "service/fusion/fusion_api.hpp"

#include <fmt/format.h>

#include "protocol/json_depth.hpp"
#include "service/client_auth.hpp"
#include "service/fusion/fusion_job.hpp"
#include "service/fusion/run_code.hpp"
#include "service/fusion/run_jupyter.hpp"
#include "service/native/native_wire.hpp"

namespace agentvm {

bool FusionApi::takes(const HttpExchange& head) const
{
    return head.path() == "/run_code" || head.path() == "/run_jupyter";
}

HttpServer::Admission FusionApi::admit(HttpExchange& head)
{
    HttpServer::Admission admission;
    admission.errors = &native_errors();
    admission.handler = [this](const std::shared_ptr<HttpExchange>& exchange) { handle(exchange); };
    // Its files come inside the JSON body, base64-encoded.
    admission.max_body = max_fusion_body;
    admission.refusal = client_refusal(head, token_);
    return admission;
}

void FusionApi::handle(const std::shared_ptr<HttpExchange>& exchange)
{
    try {
        if (exchange->method() != "POST")
            throw RefusedRequest(ServiceError::method_not_allowed, fmt::format("{} takes POST", exchange->path()));
        // Before anything parses the body: what is done with a parsed body recurses.
        if (!json_depth_within(exchange->body()))
            throw RefusedRequest(ServiceError::bad_json,
                               fmt::format("the body nests arrays and objects deeper than {} levels", max_json_depth));
        if (exchange->path() == "/run_code")
            run_code(manager_, exchange);
        else
            run_jupyter(manager_, exchange);
    } catch (const RefusedRequest& e) {
        exchange->refuse(e.code, e.what());
    }
}

} // namespace agentvm
