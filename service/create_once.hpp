// Idempotency-Key on a create's HTTP exchange (docs/api.md, "Idempotent creates"), for every
// facade whose creates take one: reads and checks the header, runs the create under its key in
// the facade's own IdempotentCreates (each API its own keys), and answers its repeats.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "service/http_server.hpp"
#include "service/idempotent_creates.hpp"

namespace agentvm {

inline constexpr const char* idempotency_key_header = "Idempotency-Key";
// On the answer to a repeat: the sandboxes are those an earlier create with its key made.
inline constexpr const char* idempotent_replayed_header = "Idempotent-Replayed";

class CreateOnce {
public:
    // Answers a repeat with the sandboxes `ids` its key's first create made, as they are now.
    using AnswerMade = std::function<void(HttpExchange& repeat, const std::vector<std::string>& ids)>;

    // The create `exchange` asks for, under its Idempotency-Key when it has one. nullopt: the
    // request repeats a create, and is answered here, at once or when the first ends: through
    // `answer_made` with Idempotent-Replayed: true, or with the first's refusal. Throws
    // RefusedRequest: bad_field for a malformed key, idempotency_conflict for a key an earlier
    // create used with another method, path or body.
    static std::optional<CreateOnce> begin(IdempotentCreates& store, const std::shared_ptr<HttpExchange>& exchange,
                                           AnswerMade answer_made);

    // The create made `ids`: whether anyone takes them (its own client, or a repeat that
    // waited for it). False: nobody knows them; the caller removes them and answers nothing.
    bool made(HttpExchange& creator, const std::vector<std::string>& ids) const;
    // The create was refused: so are the repeats that waited for it, and its key is free again.
    void refused(const Refusal& refusal) const;

private:
    IdempotentCreates* store_ = nullptr;  // nullptr: the create has no key
    std::string key_;
};

// What a create asks for, as a key's requests are compared: its method, its path, and its body
// as JSON (the same fields and values in any order and spacing), or its bytes when not JSON.
std::string create_fingerprint(const std::string& method, const std::string& path, const std::string& body);

} // namespace agentvm
