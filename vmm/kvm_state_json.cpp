#include "vmm/kvm_state_json.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <span>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "core/state_codec.hpp"

namespace agentvm {
namespace {

using nlohmann::json;

json binary(std::span<const uint8_t> bytes)
{
    return json::binary(std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

template <typename T>
json blob(const T& value)
{
    static_assert(std::is_trivially_copyable_v<T>);
    // SAFETY: any trivially copyable object may be read as its bytes.
    return binary({reinterpret_cast<const uint8_t*>(&value), sizeof(T)});
}

using state_codec::Fields;
using state_codec::fail;

// A KVM struct kept as its bytes: exactly sizeof(T) of them.
template <typename T>
T blob_field(Fields& fields, std::string_view key)
{
    static_assert(std::is_trivially_copyable_v<T>);
    const std::vector<uint8_t> data = fields.bytes(key);
    if (data.size() != sizeof(T))
        fail(fields.path(key), fmt::format("{} bytes, not {}", data.size(), sizeof(T)));
    T value;
    std::memcpy(&value, data.data(), sizeof(T));
    return value;
}

json msrs_to_json(const std::vector<Msr>& msrs)
{
    json out = json::array();
    for (const auto& msr : msrs)
        out.push_back(json::array({msr.index, msr.value}));
    return out;
}

std::vector<Msr> msrs_from_json(Fields& fields)
{
    const json& list = fields.array("msrs");
    const std::string path = fields.path("msrs");
    if (list.size() > max_msrs)
        fail(path, fmt::format("{} MSRs, more than {}", list.size(), max_msrs));
    std::vector<Msr> msrs;
    std::set<uint32_t> seen;
    for (size_t i = 0; i < list.size(); ++i) {
        const json& pair = list[i];
        const auto where = [&] { return state_codec::element(path, i); };
        if (!pair.is_array() || pair.size() != 2)
            fail(where(), fmt::format("expected an MSR's [index, value] pair, got {}", state_codec::describe(pair)));
        const Msr msr{state_codec::as_uint<uint32_t>(pair[0], where), state_codec::as_uint<uint64_t>(pair[1], where)};
        if (!seen.insert(msr.index).second)
            fail(where(), fmt::format("MSR {:#x} appears twice", msr.index));
        msrs.push_back(msr);
    }
    return msrs;
}

std::vector<kvm_cpuid_entry2> cpuid_from_json(Fields& fields)
{
    const std::vector<uint8_t> data = fields.bytes("cpuid");
    constexpr size_t entry = sizeof(kvm_cpuid_entry2);
    if (data.size() % entry != 0)
        fail(fields.path("cpuid"), fmt::format("{} bytes, not a whole number of {}-byte entries", data.size(), entry));
    if (data.size() / entry > max_cpuid_entries)
        fail(fields.path("cpuid"), fmt::format("{} CPUID entries, more than {}", data.size() / entry, max_cpuid_entries));
    std::vector<kvm_cpuid_entry2> cpuid(data.size() / entry);
    // SAFETY: the vector holds exactly data.size() bytes of trivially copyable entries.
    // std::copy, not memcpy, because an empty vector's data() may be null.
    std::copy(data.begin(), data.end(), reinterpret_cast<uint8_t*>(cpuid.data()));
    return cpuid;
}

kvm_irqchip irqchip_from_json(Fields& fields, std::string_view key, uint32_t chip_id)
{
    const auto chip = blob_field<kvm_irqchip>(fields, key);
    if (chip.chip_id != chip_id)
        fail(fields.path(key), fmt::format("holds irqchip {}, not {}", chip.chip_id, chip_id));
    return chip;
}

} // namespace

json vcpu_state_to_json(const VcpuState& state)
{
    return {
        // SAFETY: kvm_cpuid_entry2 is trivially copyable; the span covers the whole vector.
        {"cpuid", binary({reinterpret_cast<const uint8_t*>(state.cpuid.data()),
                          state.cpuid.size() * sizeof(kvm_cpuid_entry2)})},
        {"mp_state", state.mp_state.mp_state},
        {"regs", blob(state.regs)},
        {"sregs", blob(state.sregs)},
        {"xsave", binary(state.xsave)},
        {"xcrs", blob(state.xcrs)},
        {"debugregs", blob(state.debugregs)},
        {"lapic", blob(state.lapic)},
        {"msrs", msrs_to_json(state.msrs)},
        {"vcpu_events", blob(state.events)},
    };
}

VcpuState vcpu_state_from_json(const json& value, std::string_view path)
{
    Fields fields(value, path);
    VcpuState state;
    state.cpuid = cpuid_from_json(fields);
    state.mp_state.mp_state = fields.uint<uint32_t>("mp_state");
    state.regs = blob_field<kvm_regs>(fields, "regs");
    state.sregs = blob_field<kvm_sregs>(fields, "sregs");
    state.xsave = fields.bytes("xsave");
    if (state.xsave.size() < min_xsave_bytes || state.xsave.size() > max_xsave_bytes)
        fail(fields.path("xsave"),
             fmt::format("{} bytes, not {} to {}", state.xsave.size(), min_xsave_bytes, max_xsave_bytes));
    state.xcrs = blob_field<kvm_xcrs>(fields, "xcrs");
    if (state.xcrs.nr_xcrs > KVM_MAX_XCRS)
        fail(fields.path("xcrs"), fmt::format("counts {} XCRs, more than {}", state.xcrs.nr_xcrs, KVM_MAX_XCRS));
    state.debugregs = blob_field<kvm_debugregs>(fields, "debugregs");
    state.lapic = blob_field<kvm_lapic_state>(fields, "lapic");
    state.msrs = msrs_from_json(fields);
    state.events = blob_field<kvm_vcpu_events>(fields, "vcpu_events");
    fields.done();
    return state;
}

json vm_kvm_state_to_json(const VmKvmState& state)
{
    return {
        {"pic_master", blob(state.pic_master)},
        {"pic_slave", blob(state.pic_slave)},
        {"ioapic", blob(state.ioapic)},
        {"pit", blob(state.pit)},
        {"clock", blob(state.clock)},
    };
}

VmKvmState vm_kvm_state_from_json(const json& value, std::string_view path)
{
    Fields fields(value, path);
    VmKvmState state;
    state.pic_master = irqchip_from_json(fields, "pic_master", KVM_IRQCHIP_PIC_MASTER);
    state.pic_slave = irqchip_from_json(fields, "pic_slave", KVM_IRQCHIP_PIC_SLAVE);
    state.ioapic = irqchip_from_json(fields, "ioapic", KVM_IRQCHIP_IOAPIC);
    state.pit = blob_field<kvm_pit_state2>(fields, "pit");
    state.clock = blob_field<kvm_clock_data>(fields, "clock");
    fields.done();
    return state;
}

} // namespace agentvm
