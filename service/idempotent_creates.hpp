// Creates made once per Idempotency-Key (docs/api.md, "Idempotent creates"): what one API's
// keys made, so that a create repeated with the same key (a client's retry after a timeout, a
// balancer's retry) is answered with the same sandboxes instead of making more. Pure: keys,
// request fingerprints, waiters as callbacks and an injected clock; the HTTP side is
// service/create_once.hpp.
//
// A key is in one of two states. Pending: its first create runs, and repeats wait for its
// outcome (they are answered with what it made, or with its refusal). Made: it made its
// sandboxes, and repeats are answered with their ids at once, for `keep` after that, while at
// most `max_keys` made keys are kept (the oldest dropped first). A refused create made nothing
// and is not remembered: a repeat after it tries again. Neither is a create that made
// sandboxes nobody took (its client went away, and no repeat waited for them): the caller
// removes them, and a repeat makes new ones.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "service/problem.hpp"

namespace agentvm {

inline constexpr size_t max_idempotency_key = 255;

// Whether `key` can be an Idempotency-Key: 1 to 255 printable ASCII characters (space to '~').
bool valid_idempotency_key(std::string_view key);

struct IdempotentCreateLimits {
    std::chrono::seconds keep{3600};  // how long a made key answers repeats
    size_t max_keys = 10000;          // made keys kept at most; pending ones are not counted
};

class IdempotentCreates {
public:
    using Clock = std::chrono::steady_clock;
    using Limits = IdempotentCreateLimits;

    // What a repeat that waited is answered with: the sandboxes the first made, or its refusal.
    struct Outcome {
        std::vector<std::string> ids;
        std::optional<Refusal> refusal;
    };
    struct Waiter {
        std::function<bool()> present;  // whether its client still waits for the answer
        std::function<void(const Outcome&)> answer;
    };

    enum class Step {
        first,     // no create holds the key: run it here, then call made() or refused()
        waiting,   // the first still runs: the waiter is answered when it ends
        replay,    // it made `ids` already
        conflict,  // the key was used with a request of another fingerprint
    };
    struct Begun {
        Step step;
        std::vector<std::string> ids;  // replay's
    };

    explicit IdempotentCreates(Limits limits = {}, std::function<Clock::time_point()> now = &Clock::now)
        : limits_(limits), now_(std::move(now))
    {
    }

    // A create under `key`, whose request is `fingerprint` (a digest of what it asks for). The
    // waiter is kept only when the step is `waiting`.
    Begun begin(const std::string& key, const std::string& fingerprint, Waiter waiter);

    // The first create under `key` made `ids`. `creator_present`: its client is still there to
    // be answered. Present waiters are answered with the ids (those gone are dropped); true when
    // anyone took them. False: nobody knows the sandboxes, whose key is forgotten, and the
    // caller removes them.
    bool made(const std::string& key, std::vector<std::string> ids, bool creator_present);
    // The first create under `key` was refused: its waiters get the same refusal, and the key
    // is forgotten.
    void refused(const std::string& key, const Refusal& refusal);

    // Keys held, pending and made (expired ones are dropped as the store is used).
    size_t size() const { return entries_.size(); }

private:
    struct Entry {
        std::string fingerprint;
        bool made = false;
        std::vector<std::string> ids;
        std::vector<Waiter> waiters;
    };

    // Drops made keys past `keep`, then the oldest past `max_keys`.
    void expire();
    // The pending entry of `key`, taken out of the store; nullopt when there is none.
    std::optional<Entry> take_pending(const std::string& key);

    Limits limits_;
    std::function<Clock::time_point()> now_;
    std::map<std::string, Entry> entries_;
    // The made keys, oldest first, with when they were made: a key leaves the store through
    // here once made, so both bounds are checked from the front.
    std::deque<std::pair<std::string, Clock::time_point>> made_order_;
};

} // namespace agentvm
