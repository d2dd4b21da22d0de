// Creates made once per Idempotency-Key (service/idempotent_creates.hpp): the first runs,
// repeats wait for it or replay it, another request under the key conflicts, refusals and
// sandboxes nobody took are forgotten, and made keys are dropped by age and by number.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "service/create_once.hpp"
#include "service/idempotent_creates.hpp"

using namespace agentvm;
using namespace std::chrono_literals;

namespace {

using Step = IdempotentCreates::Step;

struct FakeClock {
    IdempotentCreates::Clock::time_point now{};
    std::function<IdempotentCreates::Clock::time_point()> fn()
    {
        return [this] { return now; };
    }
};

// A repeat's client: whether it is still there, and what it was answered.
struct Client {
    bool present = true;
    int answers = 0;
    IdempotentCreates::Outcome outcome;
    IdempotentCreates::Waiter waiter()
    {
        return {[this] { return present; },
                [this](const IdempotentCreates::Outcome& o) {
                    ++answers;
                    outcome = o;
                }};
    }
};

IdempotentCreates::Waiter no_waiter()
{
    return {[] { return true; }, [](const IdempotentCreates::Outcome&) { FAIL("a waiter that should not wait was answered"); }};
}

} // namespace

TEST_CASE("an Idempotency-Key is 1 to 255 printable ASCII characters")
{
    CHECK(valid_idempotency_key("a"));
    CHECK(valid_idempotency_key("retry 7f3c-~!"));
    CHECK(valid_idempotency_key(std::string(max_idempotency_key, 'k')));
    CHECK_FALSE(valid_idempotency_key(""));
    CHECK_FALSE(valid_idempotency_key(std::string(max_idempotency_key + 1, 'k')));
    CHECK_FALSE(valid_idempotency_key("tab\there"));
    CHECK_FALSE(valid_idempotency_key("del\x7f"));
    CHECK_FALSE(valid_idempotency_key("caf\xc3\xa9"));
}

TEST_CASE("the first create runs; a repeat while it runs waits for its sandboxes, one after replays them")
{
    FakeClock clock;
    IdempotentCreates store({}, clock.fn());
    CHECK(store.begin("k", "body", no_waiter()).step == Step::first);
    Client waiting;
    CHECK(store.begin("k", "body", waiting.waiter()).step == Step::waiting);
    CHECK(waiting.answers == 0);
    CHECK(store.made("k", {"sb-1"}, true));
    CHECK(waiting.answers == 1);
    CHECK(waiting.outcome.ids == std::vector<std::string>{"sb-1"});
    CHECK_FALSE(waiting.outcome.refusal);
    const auto replay = store.begin("k", "body", no_waiter());
    CHECK(replay.step == Step::replay);
    CHECK(replay.ids == std::vector<std::string>{"sb-1"});
    // Another key is another create.
    CHECK(store.begin("other", "body", no_waiter()).step == Step::first);
}

TEST_CASE("a key used with another request conflicts, while its create runs and after")
{
    IdempotentCreates store;
    CHECK(store.begin("k", "body", no_waiter()).step == Step::first);
    CHECK(store.begin("k", "other body", no_waiter()).step == Step::conflict);
    store.made("k", {"sb-1", "sb-2"}, true);
    CHECK(store.begin("k", "other body", no_waiter()).step == Step::conflict);
    CHECK(store.begin("k", "body", no_waiter()).ids == std::vector<std::string>{"sb-1", "sb-2"});
}

TEST_CASE("a refused create is not remembered: its waiters get its refusal, a later repeat runs again")
{
    IdempotentCreates store;
    CHECK(store.begin("k", "body", no_waiter()).step == Step::first);
    Client waiting;
    CHECK(store.begin("k", "body", waiting.waiter()).step == Step::waiting);
    store.refused("k", Refusal{ServiceError::at_capacity, "full", 1});
    CHECK(waiting.answers == 1);
    REQUIRE(waiting.outcome.refusal);
    CHECK(waiting.outcome.refusal->code == ServiceError::at_capacity);
    CHECK(waiting.outcome.ids.empty());
    CHECK(store.size() == 0);
    CHECK(store.begin("k", "body", no_waiter()).step == Step::first);
    // A refused key is free for another request too: nothing was made under it.
    store.refused("k", Refusal{ServiceError::draining, "draining", std::nullopt});
    CHECK(store.begin("k", "another body", no_waiter()).step == Step::first);
}

TEST_CASE("sandboxes whose creator went away go to a repeat that waits for them")
{
    IdempotentCreates store;
    store.begin("k", "body", no_waiter());
    Client gone, waiting;
    store.begin("k", "body", gone.waiter());
    store.begin("k", "body", waiting.waiter());
    gone.present = false;
    CHECK(store.made("k", {"sb-1"}, false));  // taken: the caller keeps them
    CHECK(gone.answers == 0);
    CHECK(waiting.answers == 1);
    CHECK(waiting.outcome.ids == std::vector<std::string>{"sb-1"});
    CHECK(store.begin("k", "body", no_waiter()).step == Step::replay);
}

TEST_CASE("sandboxes nobody took are forgotten with their key: a repeat makes new ones")
{
    IdempotentCreates store;
    store.begin("k", "body", no_waiter());
    Client gone;
    store.begin("k", "body", gone.waiter());
    gone.present = false;
    CHECK_FALSE(store.made("k", {"sb-1"}, false));  // the caller removes them
    CHECK(gone.answers == 0);
    CHECK(store.size() == 0);
    CHECK(store.begin("k", "body", no_waiter()).step == Step::first);
}

TEST_CASE("made keys are remembered for `keep`, and at most max_keys of them, the oldest dropped first")
{
    FakeClock clock;
    IdempotentCreates store({std::chrono::seconds(3600), 3}, clock.fn());
    for (const char* key : {"a", "b", "c"}) {
        store.begin(key, "body", no_waiter());
        store.made(key, {std::string("sb-") + key}, true);
        clock.now += 10min;
    }
    // A pending key is not counted, nor dropped.
    store.begin("pending", "body", no_waiter());
    CHECK(store.size() == 4);
    store.begin("d", "body", no_waiter());
    store.made("d", {"sb-d"}, true);
    CHECK(store.begin("a", "body", no_waiter()).step == Step::first);  // dropped: the oldest
    store.refused("a", Refusal{ServiceError::internal, "", std::nullopt});
    CHECK(store.begin("b", "body", no_waiter()).step == Step::replay);
    // "b" was made at 10 min, "c" at 20 min, "d" at 30 min: at 1 h 10 min "b" is over an hour old.
    clock.now = IdempotentCreates::Clock::time_point{} + 70min;
    CHECK(store.begin("b", "body", no_waiter()).step == Step::first);
    CHECK(store.begin("c", "body", no_waiter()).step == Step::replay);
    clock.now += 10min;
    CHECK(store.begin("c", "body", no_waiter()).step == Step::first);
    CHECK(store.begin("d", "body", no_waiter()).step == Step::replay);
    CHECK(store.begin("pending", "other", no_waiter()).step == Step::conflict);  // still running
}

TEST_CASE("a create's fingerprint: its method, path and body as JSON, in any key order and spacing")
{
    const std::string base = create_fingerprint("POST", "/v1/sandboxes", R"({"pool":"a","timeout":60})");
    CHECK(create_fingerprint("POST", "/v1/sandboxes", "{ \"timeout\": 60,\n \"pool\": \"a\" }") == base);
    CHECK(create_fingerprint("POST", "/v1/sandboxes", R"({"pool":"a","timeout":61})") != base);
    CHECK(create_fingerprint("POST", "/v1/sandboxes/x/fork", R"({"pool":"a","timeout":60})") != base);
    CHECK(create_fingerprint("PUT", "/v1/sandboxes", R"({"pool":"a","timeout":60})") != base);
    // Not JSON: its bytes.
    CHECK(create_fingerprint("POST", "/v1/sandboxes", "{oops") == create_fingerprint("POST", "/v1/sandboxes", "{oops"));
    CHECK(create_fingerprint("POST", "/v1/sandboxes", "{oops") != create_fingerprint("POST", "/v1/sandboxes", "{oops "));
}
