#include "service/create_once.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/file_digest.hpp"

namespace agentvm {
namespace {

// A repeat's answer runs when its first create ends, inside the manager's callback: what it
// throws fails that repeat alone.
void answer_repeat(HttpExchange& repeat, const CreateOnce::AnswerMade& answer_made,
                   const IdempotentCreates::Outcome& outcome)
{
    try {
        if (outcome.refusal)
            return repeat.refuse(*outcome.refusal);
        repeat.add_header(idempotent_replayed_header, "true");
        answer_made(repeat, outcome.ids);
    } catch (const RefusedRequest& e) {
        repeat.refuse(e.code, e.what());
    } catch (const std::exception& e) {
        repeat.fail(e);
    }
}

} // namespace

std::string create_fingerprint(const std::string& method, const std::string& path, const std::string& body)
{
    const nlohmann::json json = nlohmann::json::parse(body, nullptr, false);
    // nlohmann's objects are ordered maps: dump() writes their keys sorted.
    const std::string canonical = json.is_discarded() ? "raw:" + body : "json:" + json.dump();
    return sha256_hex(fmt::format("{} {}\n{}", method, path, canonical));
}

std::optional<CreateOnce> CreateOnce::begin(IdempotentCreates& store, const std::shared_ptr<HttpExchange>& exchange,
                                            AnswerMade answer_made)
{
    CreateOnce once;
    const std::optional<std::string> key = exchange->header(idempotency_key_header);
    if (!key)
        return once;
    if (!valid_idempotency_key(*key))
        throw_bad_field(fmt::format("{} must be 1 to {} printable ASCII characters", idempotency_key_header,
                                    max_idempotency_key));
    IdempotentCreates::Waiter waiter{
        [exchange] { return !exchange->client_closed(); },
        [exchange, answer_made](const IdempotentCreates::Outcome& outcome) {
            answer_repeat(*exchange, answer_made, outcome);
        }};
    const IdempotentCreates::Begun begun =
        store.begin(*key, create_fingerprint(exchange->method(), exchange->path(), exchange->body()), std::move(waiter));
    switch (begun.step) {
    case IdempotentCreates::Step::first:
        once.store_ = &store;
        once.key_ = *key;
        return once;
    case IdempotentCreates::Step::waiting:
        return std::nullopt;
    case IdempotentCreates::Step::replay:
        answer_repeat(*exchange, answer_made, IdempotentCreates::Outcome{begun.ids, std::nullopt});
        return std::nullopt;
    case IdempotentCreates::Step::conflict:
        break;
    }
    throw RefusedRequest(ServiceError::idempotency_conflict,
                         fmt::format("{} {:.64} was used by an earlier create with another request (method, path or "
                                     "body): a key names one create",
                                     idempotency_key_header, *key));
}

bool CreateOnce::made(HttpExchange& creator, const std::vector<std::string>& ids) const
{
    const bool present = !creator.client_closed();
    return store_ ? store_->made(key_, ids, present) : present;
}

void CreateOnce::refused(const Refusal& refusal) const
{
    if (store_)
        store_->refused(key_, refusal);
}

} // namespace agentvm
