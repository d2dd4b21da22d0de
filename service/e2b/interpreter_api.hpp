// The code interpreter as E2B's @e2b/code-interpreter reaches it on port 49999 (docs/e2b.md,
// "Code interpreter"): POST /execute streaming NDJSON from the agent's run_code, and
// /contexts from its interpreter contexts.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "service/e2b/sandbox_tokens.hpp"
#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

class InterpreterApi {
public:
    InterpreterApi(SandboxManager& manager, const SandboxTokens& tokens)
        : manager_(manager), tokens_(tokens), counts_(std::make_shared<ExecutionCounts>())
    {
    }

    // Checks the request's E2B-Traffic-Access-Token (or X-Access-Token) against the
    // sandbox's, then its sandbox (502 when it is not running), and gives its handler.
    HttpServer::Admission admit(HttpExchange& head, const std::string& sandbox_id);

private:
    // Jupyter's execution_count, which the agent does not keep: the cells each context of
    // each sandbox has run, from 1, begun again when the context restarts or its
    // interpreter dies. Shared with the calls' handlers, which may outlive a request.
    struct ExecutionCounts {
        std::map<std::string, std::map<std::string, uint64_t>> by_sandbox;
        uint64_t next(const std::string& sandbox_id, const std::string& context)
        {
            return ++by_sandbox[sandbox_id][context];
        }
        void reset(const std::string& sandbox_id, const std::string& context);
    };

    void handle(const std::shared_ptr<HttpExchange>& exchange, const std::string& sandbox_id);
    void execute(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox);
    void contexts(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                  const std::string& rest);
    // Counts of sandboxes that are gone (neither running nor paused), dropped now and then.
    void prune_counts();

    SandboxManager& manager_;
    const SandboxTokens& tokens_;
    std::shared_ptr<ExecutionCounts> counts_;
};

} // namespace agentvm
