#include "vmm/kvm_state_json.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

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

// A non-negative integer, whichever way it was stored: nlohmann keeps numbers parsed from
// CBOR or text as unsigned, but numbers built from signed C++ integers as signed.
std::optional<uint64_t> as_unsigned(const json& value)
{
    if (value.is_number_unsigned())
        return value.get<uint64_t>();
    if (value.is_number_integer() && value.get<int64_t>() >= 0)
        return static_cast<uint64_t>(value.get<int64_t>());
    return std::nullopt;
}

// Field access on one JSON object, each failure an Error that says where.
class Fields {
public:
    Fields(const json& object, const char* what) : object_(object), what_(what)
    {
        if (!object.is_object())
            throw Error(fmt::format("{}: a {}, not an object", what_, object.type_name()));
    }

    const json& get(const char* name) const
    {
        const auto it = object_.find(name);
        if (it == object_.end())
            throw Error(fmt::format("{}: missing field '{}'", what_, name));
        return *it;
    }

    const std::vector<uint8_t>& bytes(const char* name) const
    {
        const json& value = get(name);
        if (!value.is_binary())
            throw Error(fmt::format("{}: field '{}' is a {}, not a binary blob", what_, name,
                                    value.type_name()));
        return value.get_binary();
    }

    template <typename T>
    T object(const char* name) const
    {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto& data = bytes(name);
        if (data.size() != sizeof(T))
            throw Error(fmt::format("{}: field '{}' has {} bytes, not {}", what_, name,
                                    data.size(), sizeof(T)));
        T value;
        std::memcpy(&value, data.data(), sizeof(T));
        return value;
    }

    uint32_t u32(const json& value, const char* name) const
    {
        const auto number = as_unsigned(value);
        if (!number || *number > std::numeric_limits<uint32_t>::max())
            throw Error(fmt::format("{}: {} is not a 32-bit unsigned number", what_, name));
        return static_cast<uint32_t>(*number);
    }

    const char* what() const { return what_; }

private:
    const json& object_;
    const char* what_;
};

json msrs_to_json(const std::vector<Msr>& msrs)
{
    json out = json::array();
    for (const auto& msr : msrs)
        out.push_back(json::array({msr.index, msr.value}));
    return out;
}

std::vector<Msr> msrs_from_json(const Fields& fields)
{
    const json& list = fields.get("msrs");
    if (!list.is_array())
        throw Error(fmt::format("{}: field 'msrs' is a {}, not an array", fields.what(), list.type_name()));
    if (list.size() > max_msrs)
        throw Error(fmt::format("{}: {} MSRs, more than {}", fields.what(), list.size(), max_msrs));
    std::vector<Msr> msrs;
    std::set<uint32_t> seen;
    for (const json& pair : list) {
        const auto value = pair.is_array() && pair.size() == 2 ? as_unsigned(pair[1]) : std::nullopt;
        if (!value)
            throw Error(fmt::format("{}: an MSR is not an [index, value] pair of unsigned numbers",
                                    fields.what()));
        const Msr msr{fields.u32(pair[0], "an MSR index"), *value};
        if (!seen.insert(msr.index).second)
            throw Error(fmt::format("{}: MSR {:#x} appears twice", fields.what(), msr.index));
        msrs.push_back(msr);
    }
    return msrs;
}

std::vector<kvm_cpuid_entry2> cpuid_from_json(const Fields& fields)
{
    const auto& data = fields.bytes("cpuid");
    constexpr size_t entry = sizeof(kvm_cpuid_entry2);
    if (data.size() % entry != 0)
        throw Error(fmt::format("{}: field 'cpuid' has {} bytes, not a whole number of {}-byte "
                                "entries", fields.what(), data.size(), entry));
    if (data.size() / entry > max_cpuid_entries)
        throw Error(fmt::format("{}: {} CPUID entries, more than {}", fields.what(),
                                data.size() / entry, max_cpuid_entries));
    std::vector<kvm_cpuid_entry2> cpuid(data.size() / entry);
    // SAFETY: the vector holds exactly data.size() bytes of trivially copyable entries.
    // std::copy, not memcpy, because an empty vector's data() may be null.
    std::copy(data.begin(), data.end(), reinterpret_cast<uint8_t*>(cpuid.data()));
    return cpuid;
}

kvm_irqchip irqchip_from_json(const Fields& fields, const char* name, uint32_t chip_id)
{
    const auto chip = fields.object<kvm_irqchip>(name);
    if (chip.chip_id != chip_id)
        throw Error(fmt::format("{}: field '{}' holds irqchip {}, not {}", fields.what(), name,
                                chip.chip_id, chip_id));
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

VcpuState vcpu_state_from_json(const json& value)
{
    const Fields fields(value, "vCPU state");
    VcpuState state;
    state.cpuid = cpuid_from_json(fields);
    state.mp_state.mp_state = fields.u32(fields.get("mp_state"), "field 'mp_state'");
    state.regs = fields.object<kvm_regs>("regs");
    state.sregs = fields.object<kvm_sregs>("sregs");
    const auto& xsave = fields.bytes("xsave");
    if (xsave.size() < min_xsave_bytes || xsave.size() > max_xsave_bytes)
        throw Error(fmt::format("vCPU state: field 'xsave' has {} bytes, not {} to {}",
                                xsave.size(), min_xsave_bytes, max_xsave_bytes));
    state.xsave.assign(xsave.begin(), xsave.end());
    state.xcrs = fields.object<kvm_xcrs>("xcrs");
    if (state.xcrs.nr_xcrs > KVM_MAX_XCRS)
        throw Error(fmt::format("vCPU state: field 'xcrs' counts {} XCRs, more than {}",
                                state.xcrs.nr_xcrs, KVM_MAX_XCRS));
    state.debugregs = fields.object<kvm_debugregs>("debugregs");
    state.lapic = fields.object<kvm_lapic_state>("lapic");
    state.msrs = msrs_from_json(fields);
    state.events = fields.object<kvm_vcpu_events>("vcpu_events");
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

VmKvmState vm_kvm_state_from_json(const json& value)
{
    const Fields fields(value, "VM KVM state");
    VmKvmState state;
    state.pic_master = irqchip_from_json(fields, "pic_master", KVM_IRQCHIP_PIC_MASTER);
    state.pic_slave = irqchip_from_json(fields, "pic_slave", KVM_IRQCHIP_PIC_SLAVE);
    state.ioapic = irqchip_from_json(fields, "ioapic", KVM_IRQCHIP_IOAPIC);
    state.pit = fields.object<kvm_pit_state2>("pit");
    state.clock = fields.object<kvm_clock_data>("clock");
    return state;
}

} // namespace agentvm
