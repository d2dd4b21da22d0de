// SandboxFusion's endpoints as a facade (docs/api.md, "SandboxFusion"): POST /run_code and
// /run_jupyter, each a sandbox made for one request and deleted after it (run_code.hpp,
// run_jupyter.hpp). A refused request answers in the native API's error shape, as it always
// has: SandboxFusion's clients read only the run results.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "service/facade.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

class FusionApi : public Facade {
public:
    // `token`: what client_auth.hpp requires of every request, when set.
    FusionApi(SandboxManager& manager, std::optional<std::string> token)
        : manager_(manager), token_(std::move(token))
    {
    }

    bool takes(const HttpExchange& head) const override;
    HttpServer::Admission admit(HttpExchange& head) override;

private:
    void handle(const std::shared_ptr<HttpExchange>& exchange);

    SandboxManager& manager_;
    std::optional<std::string> token_;
};

} // namespace agentvm
