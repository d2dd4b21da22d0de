#include "vmm/mptable.hpp"

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "core/layout.hpp"

namespace agentvm {
namespace {

// Layouts from the MP spec 1.4 (and Linux's asm/mpspec_def.h, which is not UAPI).
#pragma pack(push, 1)
struct MpFloating {
    char signature[4];   // "_MP_"
    uint32_t physptr;    // configuration table address
    uint8_t length;      // in 16-byte units
    uint8_t specification;
    uint8_t checksum;
    uint8_t feature[5];
};
struct MpConfigHeader {
    char signature[4];   // "PCMP"
    uint16_t length;     // header plus entries
    uint8_t spec;
    uint8_t checksum;
    char oem[8];
    char product[12];
    uint32_t oem_ptr;
    uint16_t oem_size;
    uint16_t entry_count;
    uint32_t lapic;
    uint16_t ext_length;
    uint8_t ext_checksum;
    uint8_t reserved;
};
struct MpProcessor {
    uint8_t type;
    uint8_t apic_id;
    uint8_t apic_version;
    uint8_t cpu_flags;
    uint32_t cpu_signature;
    uint32_t feature_flags;
    uint32_t reserved[2];
};
struct MpBus {
    uint8_t type;
    uint8_t bus_id;
    char bus_type[6];
};
struct MpIoapic {
    uint8_t type;
    uint8_t apic_id;
    uint8_t apic_version;
    uint8_t flags;
    uint32_t address;
};
struct MpInterrupt {
    uint8_t type;
    uint8_t irq_type;
    uint16_t irq_flags;
    uint8_t src_bus;
    uint8_t src_irq;
    uint8_t dst_apic;
    uint8_t dst_pin;
};
#pragma pack(pop)
static_assert(sizeof(MpFloating) == 16 && sizeof(MpConfigHeader) == 44);
static_assert(sizeof(MpProcessor) == 20 && sizeof(MpBus) == 8 && sizeof(MpIoapic) == 8 &&
              sizeof(MpInterrupt) == 8);

constexpr uint8_t entry_processor = 0;
constexpr uint8_t entry_bus = 1;
constexpr uint8_t entry_ioapic = 2;
constexpr uint8_t entry_io_interrupt = 3;
constexpr uint8_t entry_local_interrupt = 4;

constexpr uint8_t cpu_enabled = 1;
constexpr uint8_t cpu_bootstrap = 2;
constexpr uint8_t irq_type_int = 0;
constexpr uint8_t irq_type_nmi = 1;
constexpr uint8_t irq_type_extint = 3;
constexpr uint8_t lapic_version = 0x14;
constexpr uint8_t ioapic_version = 0x11;
constexpr uint32_t cpu_signature_family6 = 0x600;
constexpr uint32_t feature_fpu = 1u << 0;
constexpr uint32_t feature_apic = 1u << 9;
constexpr uint8_t all_lapics = 0xff;

uint8_t checksum(const uint8_t* bytes, size_t len)
{
    uint8_t sum = 0;
    for (size_t i = 0; i < len; ++i)
        sum = static_cast<uint8_t>(sum + bytes[i]);
    return static_cast<uint8_t>(-sum);
}

template <typename T>
void append(std::vector<uint8_t>& out, const T& entry)
{
    const auto* bytes = reinterpret_cast<const uint8_t*>(&entry);
    out.insert(out.end(), bytes, bytes + sizeof(T));
}

} // namespace

void write_mptable(const GuestMemory& mem, uint32_t vcpu_count)
{
    if (vcpu_count == 0 || vcpu_count > mptable_max_vcpus)
        throw Error(fmt::format("MP table supports 1 to {} vCPUs, not {}", mptable_max_vcpus, vcpu_count));
    const uint8_t ioapic_id = static_cast<uint8_t>(vcpu_count);

    std::vector<uint8_t> entries;
    uint16_t count = 0;
    for (uint32_t cpu = 0; cpu < vcpu_count; ++cpu, ++count) {
        MpProcessor p{};
        p.type = entry_processor;
        p.apic_id = static_cast<uint8_t>(cpu);
        p.apic_version = lapic_version;
        p.cpu_flags = static_cast<uint8_t>(cpu_enabled | (cpu == 0 ? cpu_bootstrap : 0));
        p.cpu_signature = cpu_signature_family6;
        p.feature_flags = feature_fpu | feature_apic;
        append(entries, p);
    }
    append(entries, MpBus{entry_bus, 0, {'I', 'S', 'A', ' ', ' ', ' '}});
    ++count;
    append(entries, MpIoapic{entry_ioapic, ioapic_id, ioapic_version, 1,
                             static_cast<uint32_t>(layout::ioapic_base)});
    ++count;
    // ISA IRQ n is wired to IOAPIC pin n with the bus's default (edge, active high) polarity.
    for (uint8_t irq = 0; irq < layout::ioapic_pins; ++irq, ++count)
        append(entries, MpInterrupt{entry_io_interrupt, irq_type_int, 0, 0, irq, ioapic_id, irq});
    append(entries, MpInterrupt{entry_local_interrupt, irq_type_extint, 0, 0, 0, all_lapics, 0});
    append(entries, MpInterrupt{entry_local_interrupt, irq_type_nmi, 0, 0, 0, all_lapics, 1});
    count += 2;

    const uint64_t floating_gpa = layout::ebda_start;
    const uint64_t config_gpa = floating_gpa + sizeof(MpFloating);
    const uint64_t total = sizeof(MpFloating) + sizeof(MpConfigHeader) + entries.size();
    if (floating_gpa + total > layout::bios_area)
        throw Error(fmt::format("MP table for {} vCPUs does not fit in the EBDA", vcpu_count));

    MpConfigHeader header{};
    std::memcpy(header.signature, "PCMP", 4);
    header.length = static_cast<uint16_t>(sizeof(MpConfigHeader) + entries.size());
    header.spec = 4;
    std::memcpy(header.oem, "AGENTVM ", 8);
    std::memcpy(header.product, "MICROVM     ", 12);
    header.entry_count = count;
    header.lapic = static_cast<uint32_t>(layout::lapic_base);
    std::vector<uint8_t> table;
    append(table, header);
    table.insert(table.end(), entries.begin(), entries.end());
    table[offsetof(MpConfigHeader, checksum)] = checksum(table.data(), table.size());

    MpFloating floating{};
    std::memcpy(floating.signature, "_MP_", 4);
    floating.physptr = static_cast<uint32_t>(config_gpa);
    floating.length = 1;
    floating.specification = 4;
    floating.checksum = checksum(reinterpret_cast<const uint8_t*>(&floating), sizeof(floating));

    mem.write_obj(floating_gpa, floating);
    mem.write(config_gpa, table);
}

} // namespace agentvm
