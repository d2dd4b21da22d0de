#include "service/idempotent_creates.hpp"

#include <algorithm>

namespace agentvm {

bool valid_idempotency_key(std::string_view key)
{
    return !key.empty() && key.size() <= max_idempotency_key
           && std::all_of(key.begin(), key.end(), [](char c) { return c >= ' ' && c <= '~'; });
}

IdempotentCreates::Begun IdempotentCreates::begin(const std::string& key, const std::string& fingerprint,
                                                  Waiter waiter)
{
    expire();
    auto it = entries_.find(key);
    if (it == entries_.end()) {
        entries_.emplace(key, Entry{fingerprint, false, {}, {}});
        return {Step::first, {}};
    }
    Entry& entry = it->second;
    if (entry.fingerprint != fingerprint)
        return {Step::conflict, {}};
    if (entry.made)
        return {Step::replay, entry.ids};
    entry.waiters.push_back(std::move(waiter));
    return {Step::waiting, {}};
}

bool IdempotentCreates::made(const std::string& key, std::vector<std::string> ids, bool creator_present)
{
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.made)
        return creator_present;  // not begun here: nothing to remember
    std::vector<Waiter> waiters = std::move(it->second.waiters);
    it->second.waiters.clear();
    // Asked before anyone is answered: a waiter's client that left gets nothing.
    std::erase_if(waiters, [](const Waiter& waiter) { return !waiter.present || !waiter.present(); });
    if (!creator_present && waiters.empty()) {
        entries_.erase(it);
        return false;
    }
    it->second.made = true;
    it->second.ids = ids;
    made_order_.emplace_back(key, now_());
    expire();
    // Answered once the store is consistent: an answer may run code that uses it.
    const Outcome outcome{std::move(ids), std::nullopt};
    for (const Waiter& waiter : waiters)
        waiter.answer(outcome);
    return true;
}

void IdempotentCreates::refused(const std::string& key, const Refusal& refusal)
{
    std::optional<Entry> entry = take_pending(key);
    if (!entry)
        return;
    const Outcome outcome{{}, refusal};
    for (const Waiter& waiter : entry->waiters)
        waiter.answer(outcome);
}

std::optional<IdempotentCreates::Entry> IdempotentCreates::take_pending(const std::string& key)
{
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.made)
        return std::nullopt;
    Entry entry = std::move(it->second);
    entries_.erase(it);
    return entry;
}

void IdempotentCreates::expire()
{
    const Clock::time_point now = now_();
    while (!made_order_.empty()
           && (made_order_.size() > limits_.max_keys || made_order_.front().second + limits_.keep <= now)) {
        entries_.erase(made_order_.front().first);
        made_order_.pop_front();
    }
}

} // namespace agentvm
