// The VM's pause gate (vmm/pause_gate.hpp) without KVM: plain threads stand in for the vCPU
// threads, parking when asked as Vm::vcpu_loop does.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "vmm/pause_gate.hpp"

using namespace agentvm;
using namespace std::chrono_literals;
using State = PauseGate::State;

namespace {

// vCPU threads that go round until the gate stops, parking whenever a pause is asked for.
struct Vcpus {
    PauseGate& gate;
    std::atomic<int> turns{0};
    std::vector<std::thread> threads;

    Vcpus(PauseGate& g, size_t count) : gate(g)
    {
        gate.set_vcpus(count);
        for (size_t i = 0; i < count; ++i)
            threads.emplace_back([this] {
                while (!gate.stopping()) {
                    if (gate.pause_requested()) {
                        gate.park();
                        continue;
                    }
                    ++turns;
                    std::this_thread::sleep_for(100us);  // a guest's run between exits
                }
            });
    }
    ~Vcpus()
    {
        gate.stop();
        for (auto& t : threads)
            t.join();
    }
};

State wait_for(PauseGate& gate, State want)
{
    for (int i = 0; i < 5000 && gate.state() != want; ++i)
        gate.wait_parked(1ms);
    return gate.state();
}

} // namespace

TEST_CASE("running -> pause requested -> parked -> running, and again")
{
    PauseGate gate;
    Vcpus vcpus(gate, 3);
    CHECK(gate.state() == State::running);
    for (int round = 0; round < 3; ++round) {
        REQUIRE(gate.request_pause());
        CHECK(gate.state() != State::running);
        CHECK(wait_for(gate, State::parked) == State::parked);
        // Parked means parked: no vCPU goes round.
        const int turns = vcpus.turns;
        std::this_thread::sleep_for(5ms);
        CHECK(vcpus.turns == turns);
        gate.resume();
        CHECK(gate.state() == State::running);
        const int before = vcpus.turns;
        for (int i = 0; i < 5000 && vcpus.turns == before; ++i)
            std::this_thread::sleep_for(100us);
        CHECK(vcpus.turns > before);  // they went on
    }
}

TEST_CASE("one pause at a time")
{
    PauseGate gate;
    Vcpus vcpus(gate, 2);
    REQUIRE(gate.request_pause());
    CHECK_FALSE(gate.request_pause());  // requested
    REQUIRE(wait_for(gate, State::parked) == State::parked);
    CHECK_FALSE(gate.request_pause());  // parked
    gate.resume();
    CHECK(gate.request_pause());
}

TEST_CASE("a pause abandoned before every vCPU parked: back to running")
{
    PauseGate gate;
    gate.set_vcpus(2);  // two vCPUs, neither of which ever parks (stuck in the guest)
    REQUIRE(gate.request_pause());
    CHECK(gate.wait_parked(2ms) == State::pause_requested);
    gate.resume();
    CHECK(gate.state() == State::running);
}

TEST_CASE("stopping is for good, and lets parked vCPUs go")
{
    PauseGate gate;
    std::optional<Vcpus> vcpus(std::in_place, gate, 2);
    REQUIRE(gate.request_pause());
    REQUIRE(wait_for(gate, State::parked) == State::parked);
    gate.stop();
    CHECK(gate.state() == State::stopping);
    CHECK(gate.stopping());
    vcpus.reset();  // joins: the parked threads woke and ended
    CHECK_FALSE(gate.request_pause());
    gate.resume();
    CHECK(gate.state() == State::stopping);
    CHECK(gate.wait_parked(1ms) == State::stopping);
}

TEST_CASE("stopping before the vCPUs start: they never park, a pause is refused")
{
    PauseGate gate;
    gate.stop();
    CHECK_FALSE(gate.request_pause());
    Vcpus vcpus(gate, 2);
    CHECK(vcpus.turns == 0);
    gate.park();  // a vCPU that saw a request just before the stop goes straight on
    CHECK(gate.state() == State::stopping);
}
