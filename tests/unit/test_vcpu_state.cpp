// The KVM state of a snapshot in JSON/CBOR: a filled state survives the round trip byte for
// byte, and every malformed input is an Error, never a crash or a half-read state.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "vmm/kvm_state_json.hpp"

using namespace agentvm;
using nlohmann::json;

namespace {

// Every byte of a struct set, so that a field lost or moved in the round trip shows.
template <typename T>
void fill(T& value, uint8_t seed)
{
    auto* bytes = reinterpret_cast<uint8_t*>(&value);
    for (size_t i = 0; i < sizeof(T); ++i)
        bytes[i] = static_cast<uint8_t>(seed + i * 7);
}

VcpuState filled_vcpu_state()
{
    VcpuState state;
    state.cpuid.resize(3);
    for (size_t i = 0; i < state.cpuid.size(); ++i)
        fill(state.cpuid[i], static_cast<uint8_t>(i));
    state.mp_state.mp_state = KVM_MP_STATE_HALTED;
    fill(state.regs, 10);
    fill(state.sregs, 20);
    state.xsave.resize(min_xsave_bytes + 64);
    for (size_t i = 0; i < state.xsave.size(); ++i)
        state.xsave[i] = static_cast<uint8_t>(i * 13);
    fill(state.xcrs, 30);
    state.xcrs.nr_xcrs = 1;
    fill(state.debugregs, 40);
    fill(state.lapic, 50);
    state.msrs = {{0x10, 0x123456789abcdef0}, {0x6e0, 0}, {0xc0000080, 0xd01}, {0xffffffff, ~0ull}};
    fill(state.events, 60);
    return state;
}

VmKvmState filled_vm_state()
{
    VmKvmState state;
    fill(state.pic_master, 1);
    state.pic_master.chip_id = KVM_IRQCHIP_PIC_MASTER;
    fill(state.pic_slave, 2);
    state.pic_slave.chip_id = KVM_IRQCHIP_PIC_SLAVE;
    fill(state.ioapic, 3);
    state.ioapic.chip_id = KVM_IRQCHIP_IOAPIC;
    fill(state.pit, 4);
    fill(state.clock, 5);
    return state;
}

template <typename T>
bool same_bytes(const T& a, const T& b)
{
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

json through_cbor(const json& value)
{
    return json::from_cbor(json::to_cbor(value));
}

json with(json value, const char* field, json replacement)
{
    value[field] = std::move(replacement);
    return value;
}

json blob_of_size(size_t size)
{
    return json::binary(std::vector<uint8_t>(size, 0));
}

} // namespace

TEST_CASE("a filled vCPU state survives JSON and CBOR byte for byte")
{
    const VcpuState state = filled_vcpu_state();
    const json saved = vcpu_state_to_json(state);
    const VcpuState parsed = vcpu_state_from_json(through_cbor(saved));

    CHECK(vcpu_state_to_json(parsed) == saved);
    REQUIRE(parsed.cpuid.size() == 3);
    CHECK(same_bytes(parsed.cpuid[2], state.cpuid[2]));
    CHECK(parsed.mp_state.mp_state == KVM_MP_STATE_HALTED);
    CHECK(same_bytes(parsed.regs, state.regs));
    CHECK(same_bytes(parsed.sregs, state.sregs));
    CHECK(parsed.xsave == state.xsave);
    CHECK(same_bytes(parsed.xcrs, state.xcrs));
    CHECK(same_bytes(parsed.debugregs, state.debugregs));
    CHECK(same_bytes(parsed.lapic, state.lapic));
    CHECK(parsed.msrs == state.msrs);
    CHECK(same_bytes(parsed.events, state.events));
}

TEST_CASE("a filled VM state survives JSON and CBOR byte for byte")
{
    const VmKvmState state = filled_vm_state();
    const json saved = vm_kvm_state_to_json(state);
    const VmKvmState parsed = vm_kvm_state_from_json(through_cbor(saved));

    CHECK(vm_kvm_state_to_json(parsed) == saved);
    CHECK(same_bytes(parsed.pic_master, state.pic_master));
    CHECK(same_bytes(parsed.pic_slave, state.pic_slave));
    CHECK(same_bytes(parsed.ioapic, state.ioapic));
    CHECK(same_bytes(parsed.pit, state.pit));
    CHECK(same_bytes(parsed.clock, state.clock));
}

TEST_CASE("a vCPU state that is not an object, or lacks a field, is refused")
{
    for (const json& value : {json(nullptr), json(3), json("state"), json::array(), json::binary({})})
        CHECK_THROWS_WITH_AS(vcpu_state_from_json(value), doctest::Contains("snapshot: vcpu: expected an object"), Error);

    const json good = vcpu_state_to_json(filled_vcpu_state());
    for (const auto& [name, field] : good.items()) {
        CAPTURE(name);
        json missing = good;
        missing.erase(name);
        CHECK_THROWS_WITH_AS(vcpu_state_from_json(missing), doctest::Contains(("vcpu." + name + ": missing").c_str()),
                             Error);
    }
    // A field nobody reads is a corruption, not an extra to ignore.
    CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "regz", 1)), doctest::Contains("unknown field \"regz\""),
                         Error);
    CHECK_THROWS_WITH_AS(vm_kvm_state_from_json(with(vm_kvm_state_to_json(filled_vm_state()), "pitt", 1)),
                         doctest::Contains("unknown field \"pitt\""), Error);
}

TEST_CASE("every vCPU state field of the wrong type is refused")
{
    const json good = vcpu_state_to_json(filled_vcpu_state());
    for (const auto& [name, field] : good.items()) {
        CAPTURE(name);
        for (const json& wrong : {json("text"), json(-1), json(1.5), json::object(), json(nullptr)})
            CHECK_THROWS_AS(vcpu_state_from_json(with(good, name.c_str(), wrong)), Error);
        if (!field.is_binary())
            CHECK_THROWS_AS(vcpu_state_from_json(with(good, name.c_str(), blob_of_size(8))), Error);
    }
}

TEST_CASE("vCPU state blobs of the wrong size are refused")
{
    const json good = vcpu_state_to_json(filled_vcpu_state());
    const std::pair<const char*, size_t> sized[] = {
        {"regs", sizeof(kvm_regs)},          {"sregs", sizeof(kvm_sregs)},
        {"xcrs", sizeof(kvm_xcrs)},          {"debugregs", sizeof(kvm_debugregs)},
        {"lapic", sizeof(kvm_lapic_state)},  {"vcpu_events", sizeof(kvm_vcpu_events)},
    };
    for (const auto& [name, size] : sized) {
        CAPTURE(name);
        for (size_t wrong : {size_t{0}, size - 1, size + 1, 2 * size})
            CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, name, blob_of_size(wrong))),
                                 doctest::Contains(name), Error);
    }

    // XSAVE: at least the legacy 4 KiB area, at most the bound.
    for (size_t wrong : {size_t{0}, min_xsave_bytes - 1, max_xsave_bytes + 1})
        CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "xsave", blob_of_size(wrong))),
                             doctest::Contains("xsave"), Error);
    CHECK_NOTHROW(vcpu_state_from_json(with(good, "xsave", blob_of_size(max_xsave_bytes))));

    // CPUID: whole entries only, no more than KVM takes.
    const size_t entry = sizeof(kvm_cpuid_entry2);
    CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "cpuid", blob_of_size(entry + 1))),
                         doctest::Contains("whole number"), Error);
    CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "cpuid", blob_of_size(entry * (max_cpuid_entries + 1)))),
                         doctest::Contains("CPUID entries"), Error);
    CHECK(vcpu_state_from_json(with(good, "cpuid", blob_of_size(entry * max_cpuid_entries))).cpuid.size() ==
          max_cpuid_entries);
    CHECK(vcpu_state_from_json(with(good, "cpuid", blob_of_size(0))).cpuid.empty());
}

TEST_CASE("malformed vCPU state values are refused")
{
    const json good = vcpu_state_to_json(filled_vcpu_state());

    SUBCASE("mp_state beyond 32 bits")
    {
        CHECK_THROWS_AS(vcpu_state_from_json(with(good, "mp_state", 1ull << 32)), Error);
        // A non-negative number held as signed (built from an int, not parsed) is fine.
        CHECK(vcpu_state_from_json(with(good, "mp_state", int64_t{3})).mp_state.mp_state == 3);
    }
    SUBCASE("more XCRs than kvm_xcrs holds")
    {
        VcpuState state = filled_vcpu_state();
        state.xcrs.nr_xcrs = KVM_MAX_XCRS + 1;
        CHECK_THROWS_WITH_AS(vcpu_state_from_json(vcpu_state_to_json(state)), doctest::Contains("XCRs"),
                             Error);
    }
    SUBCASE("MSRs that are not [index, value] pairs of unsigned numbers")
    {
        const json bad_pairs[] = {
            json(5), json::array(), json::array({1}), json::array({1, 2, 3}), json::array({-1, 2}),
            json::array({1, -2}), json::array({1.0, 2}), json::array({1, "2"}),
            json::array({1ull << 32, 2}), json::object({{"index", 1}, {"value", 2}}),
        };
        for (const json& pair : bad_pairs) {
            CAPTURE(pair.dump());
            CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "msrs", json::array({pair}))),
                                 doctest::Contains("vcpu.msrs[0]"), Error);
        }
    }
    SUBCASE("an MSR twice")
    {
        const json msrs = json::array({json::array({0x10, 1}), json::array({0x10, 2})});
        CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "msrs", msrs)), doctest::Contains("twice"), Error);
    }
    SUBCASE("more MSRs than a vCPU has")
    {
        json msrs = json::array();
        for (uint32_t i = 0; i <= max_msrs; ++i)
            msrs.push_back(json::array({i, 0}));
        CHECK_THROWS_WITH_AS(vcpu_state_from_json(with(good, "msrs", msrs)), doctest::Contains("MSRs"), Error);
        msrs.erase(msrs.size() - 1);
        CHECK(vcpu_state_from_json(with(good, "msrs", msrs)).msrs.size() == max_msrs);
    }
}

TEST_CASE("a malformed VM state is refused")
{
    const json good = vm_kvm_state_to_json(filled_vm_state());
    CHECK_THROWS_WITH_AS(vm_kvm_state_from_json(json::array()), doctest::Contains("snapshot: vm: expected an object"),
                         Error);

    for (const auto& [name, field] : good.items()) {
        CAPTURE(name);
        json missing = good;
        missing.erase(name);
        CHECK_THROWS_WITH_AS(vm_kvm_state_from_json(missing), doctest::Contains(("vm." + name + ": missing").c_str()),
                             Error);
        CHECK_THROWS_WITH_AS(vm_kvm_state_from_json(with(good, name.c_str(), 7)),
                             doctest::Contains("expected a byte string"), Error);
        const size_t size = field.get_binary().size();
        for (size_t wrong : {size_t{0}, size - 1, size + 1})
            CHECK_THROWS_WITH_AS(vm_kvm_state_from_json(with(good, name.c_str(), blob_of_size(wrong))),
                                 doctest::Contains("bytes"), Error);
    }

    // Each irqchip blob must hold the chip its field names; KVM would load it into that chip.
    VmKvmState swapped = filled_vm_state();
    std::swap(swapped.pic_master, swapped.ioapic);
    CHECK_THROWS_WITH_AS(vm_kvm_state_from_json(vm_kvm_state_to_json(swapped)),
                         doctest::Contains("holds irqchip"), Error);
}

TEST_CASE("corrupted snapshot bytes either parse to a state or are an Error")
{
    const json good = {{"vcpu", vcpu_state_to_json(filled_vcpu_state())},
                       {"vm", vm_kvm_state_to_json(filled_vm_state())}};
    const std::vector<uint8_t> cbor = json::to_cbor(good);
    std::mt19937 random(12345);
    int parsed = 0;
    int refused = 0;
    for (int round = 0; round < 3000; ++round) {
        std::vector<uint8_t> bytes = cbor;
        const int flips = 1 + static_cast<int>(random() % 4);
        for (int i = 0; i < flips; ++i)
            bytes[random() % bytes.size()] = static_cast<uint8_t>(random());
        const json value = json::from_cbor(bytes, true, false);
        if (value.is_discarded() || !value.is_object())
            continue;
        for (const char* part : {"vcpu", "vm"}) {
            if (!value.contains(part))
                continue;
            try {
                if (std::string(part) == "vcpu")
                    vcpu_state_from_json(value[part]);
                else
                    vm_kvm_state_from_json(value[part]);
                ++parsed;
            } catch (const Error&) {
                ++refused;  // as it should be when the corruption hit something checked
            }
        }
    }
    // Both outcomes happen often, so the loop is not vacuous.
    CHECK(parsed > 1000);
    CHECK(refused > 50);
}
